// relay_frames.cpp - loopback sockets and length-prefixed protobuf frames.
#include "relay_frames.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace meshnet {

namespace {

sockaddr_in loopback(int port) {
    sockaddr_in address{};
    address.sin_family      = AF_INET;
    address.sin_port        = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
}

bool send_all(int fd, const char * data, size_t size) {
    while (size > 0) {
        const ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) {
            continue;
        }
        if (sent <= 0) {
            return false;
        }
        data += sent;
        size -= static_cast<size_t>(sent);
    }
    return true;
}

bool receive_all(int fd, char * data, size_t size) {
    while (size > 0) {
        const ssize_t got = recv(fd, data, size, 0);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            return false;
        }
        data += got;
        size -= static_cast<size_t>(got);
    }
    return true;
}

} // namespace

int listen_loopback(int port, std::string & error) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        error = std::string("local relay: socket: ") + std::strerror(errno);
        return -1;
    }
    const sockaddr_in address = loopback(port);
    if (bind(fd, reinterpret_cast<const sockaddr *>(&address), sizeof address) != 0 || listen(fd, 16) != 0) {
        error = "local relay: cannot listen on 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
        close(fd);
        return -1;
    }
    return fd;
}

int bound_port(int fd) {
    sockaddr_in address{};
    socklen_t   size = sizeof address;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&address), &size) != 0) {
        return 0;
    }
    return ntohs(address.sin_port);
}

void prepare_connection(int fd, int send_timeout_ms) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval timeout{};
    timeout.tv_sec  = send_timeout_ms / 1000;
    timeout.tv_usec = (send_timeout_ms % 1000) * 1000;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
}

int connect_loopback(int port, int send_timeout_ms, std::string & error) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        error = std::string("local relay: socket: ") + std::strerror(errno);
        return -1;
    }
    const sockaddr_in address = loopback(port);
    if (connect(fd, reinterpret_cast<const sockaddr *>(&address), sizeof address) != 0) {
        error = "local relay: cannot connect to 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(errno);
        close(fd);
        return -1;
    }
    prepare_connection(fd, send_timeout_ms);
    return fd;
}

bool write_frame(int fd, const google::protobuf::MessageLite & message) {
    const size_t size = message.ByteSizeLong();
    if (size > UINT32_MAX) {
        return false;
    }
    std::string frame(4 + size, '\0');
    const uint32_t length = static_cast<uint32_t>(size);
    for (int i = 0; i < 4; ++i) {
        frame[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
    }
    if (!message.SerializeToArray(&frame[4], static_cast<int>(size))) {
        return false;
    }
    return send_all(fd, frame.data(), frame.size());
}

bool read_frame(int fd, google::protobuf::MessageLite & message, size_t max_bytes) {
    unsigned char header[4];
    if (!receive_all(fd, reinterpret_cast<char *>(header), sizeof header)) {
        return false;
    }
    const size_t size = static_cast<size_t>(header[0]) | (static_cast<size_t>(header[1]) << 8) |
                        (static_cast<size_t>(header[2]) << 16) | (static_cast<size_t>(header[3]) << 24);
    if (size > max_bytes || size > static_cast<size_t>(INT32_MAX)) {
        return false;
    }
    std::string body(size, '\0');
    if (!receive_all(fd, body.data(), size)) {
        return false;
    }
    return message.ParseFromArray(body.data(), static_cast<int>(size));
}

} // namespace meshnet
