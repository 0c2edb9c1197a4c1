// relay_frames.cpp - loopback sockets and length-prefixed protobuf frames.
#include "relay_frames.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>

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

uint32_t little_endian(const char * bytes) {
    const auto * b = reinterpret_cast<const unsigned char *>(bytes);
    return static_cast<uint32_t>(b[0]) | (static_cast<uint32_t>(b[1]) << 8) |
           (static_cast<uint32_t>(b[2]) << 16) | (static_cast<uint32_t>(b[3]) << 24);
}

// A body is read in pieces of at most this, so memory follows the bytes that came.
constexpr size_t read_piece_bytes = 1 << 20;

} // namespace

bool same_token(const std::string & given, const std::string & token) {
    if (given.size() != token.size() || token.empty()) {
        return false;
    }
    unsigned char differ = 0;
    for (size_t i = 0; i < token.size(); ++i) {
        differ |= static_cast<unsigned char>(given[i] ^ token[i]);
    }
    return differ == 0;
}

bool write_token(int fd, const std::string & token) {
    return send_all(fd, token.data(), token.size());
}

void frame_reader::feed(const char * data, size_t size) {
    if (start_ > 0 && start_ >= buffer_.size() / 2) { // drop what was taken before growing
        buffer_.erase(0, start_);
        start_ = 0;
    }
    buffer_.append(data, size);
}

frame_reader::result frame_reader::next(std::string & body) {
    if (held() < 4) {
        return result::more;
    }
    const size_t size = little_endian(buffer_.data() + start_);
    if (size > max_bytes_ || size > static_cast<size_t>(INT32_MAX)) {
        return result::bad;
    }
    if (held() < 4 + size) {
        return result::more;
    }
    body.assign(buffer_, start_ + 4, size);
    start_ += 4 + size;
    if (start_ == buffer_.size()) {
        buffer_.clear();
        start_ = 0;
    }
    return result::frame;
}

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
    char header[4];
    if (!receive_all(fd, header, sizeof header)) {
        return false;
    }
    const size_t size = little_endian(header);
    if (size > max_bytes || size > static_cast<size_t>(INT32_MAX)) {
        return false;
    }
    std::string body;
    while (body.size() < size) {
        const size_t have = body.size();
        body.resize(have + std::min(read_piece_bytes, size - have));
        if (!receive_all(fd, body.data() + have, body.size() - have)) {
            return false;
        }
    }
    return message.ParseFromArray(body.data(), static_cast<int>(size));
}

} // namespace meshnet
