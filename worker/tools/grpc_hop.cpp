// grpc_hop.cpp - meshnet-grpc-hop: what gRPC hand-offs alone cost a decoded token on this
// host. Two processes take turns the way a 2-stage route's stages do while one session
// decodes, over one Relay stream (meshnet.shard.v1, callback API, a boundary-sized
// message each way), with the worker's thread structure: a gRPC reaction wakes an engine
// thread, which computes (spins) on an OpenMP team of --threads and writes the answer.
// There is no model, no session store and no scheduler, so the time beyond the spinning
// is the floor of any worker built this way; bench/route_bench.py prints it next to the
// route's own time outside the engines.
//
//   meshnet-grpc-hop [--compute-us 3500] [--threads 2] [--rounds 400] [--bytes 2304]
//
// Prints one JSON line: median, p10 and p90 microseconds per token beyond the compute.
#include "meshnet/shard/v1/shard_service.grpc.pb.h"

#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace pb = meshnet::shard::v1;
using hop_clock = std::chrono::steady_clock;

namespace {

struct options {
    int  compute_us = 3500; // half of SmolLM2's decode step on 2 threads here
    int  threads    = 2;
    int  rounds     = 400;
    int  bytes      = 576 * 4; // SmolLM2's boundary row in f32
    int  serve_fd   = -1;      // internal: run as the second stage, report the port here
};

// Every thread of an OpenMP team spins for `us`, as an engine step keeps its team busy.
void compute(int us, int threads) {
    #pragma omp parallel num_threads(threads)
    {
        const auto end = hop_clock::now() + std::chrono::microseconds(us);
        while (hop_clock::now() < end) {
        }
    }
}

// The engine thread's wait for work, as the worker's scheduler waits: a counted signal.
class wakeup {
public:
    void post() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++pending_;
        }
        wake_.notify_one();
    }
    void wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return pending_ > 0; });
        --pending_;
    }
private:
    std::mutex              mutex_;
    std::condition_variable wake_;
    int                     pending_ = 0;
};

// Second stage: each request read wakes the engine thread, which computes and answers.
class answering_reactor : public grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    explicit answering_reactor(const options & opt) : opt_(opt) {
        engine_ = std::thread([this] { run(); });
        StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
        if (!ok) {
            stopping_ = true;
            work_.post();
            Finish(grpc::Status::OK);
            return;
        }
        work_.post();
    }
    void OnWriteDone(bool ok) override {
        if (ok) {
            StartRead(&request_);
        }
    }
    void OnDone() override {
        engine_.join();
        delete this;
    }
private:
    void run() {
        while (true) {
            work_.wait();
            if (stopping_) {
                return;
            }
            compute(opt_.compute_us, opt_.threads);
            response_.set_batch_id(request_.batch_id());
            StartWrite(&response_);
        }
    }
    const options &    opt_;
    pb::RelayRequest   request_;
    pb::RelayResponse  response_;
    wakeup             work_;
    bool               stopping_ = false; // written before the post that the engine waits for
    std::thread        engine_;
};

class answering_service : public pb::ShardService::CallbackService {
public:
    explicit answering_service(const options & opt) : opt_(opt) {}
    grpc::ServerBidiReactor<pb::RelayRequest, pb::RelayResponse> * Relay(grpc::CallbackServerContext *) override {
        return new answering_reactor(opt_);
    }
private:
    const options & opt_;
};

int serve(const options & opt) {
    answering_service service(opt);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server || port == 0) {
        return 1;
    }
    const std::string line = std::to_string(port) + "\n";
    if (write(opt.serve_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        return 1;
    }
    close(opt.serve_fd);
    char byte;
    while (read(STDIN_FILENO, &byte, 1) > 0) { // until the first stage exits
    }
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    return 0;
}

// First stage: compute, write, wait for both the write and the answer.
class asking_reactor : public grpc::ClientBidiReactor<pb::RelayRequest, pb::RelayResponse> {
public:
    void OnWriteDone(bool ok) override { ok_ &= ok; done_.post(); }
    void OnReadDone(bool ok) override { ok_ &= ok; done_.post(); }
    void OnDone(const grpc::Status &) override {}
    bool round_trip(pb::RelayRequest & request) {
        StartWrite(&request);
        StartRead(&response_);
        done_.wait();
        done_.wait();
        return ok_;
    }
    grpc::ClientContext context;
private:
    pb::RelayResponse response_;
    wakeup            done_;
    bool              ok_ = true;
};

// Starts the second stage as a child process (this program again); its port, or 0.
int start_second_stage(const options & opt, int & stdin_pipe, pid_t & child) {
    char self[4096] = {};
    if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) {
        return 0;
    }
    int port_pipe[2], input[2];
    if (pipe(port_pipe) != 0 || pipe(input) != 0) {
        return 0;
    }
    child = fork();
    if (child < 0) {
        return 0;
    }
    if (child == 0) {
        dup2(input[0], STDIN_FILENO);
        close(input[1]);
        close(port_pipe[0]);
        const std::string fd = std::to_string(port_pipe[1]);
        const std::string us = std::to_string(opt.compute_us), threads = std::to_string(opt.threads);
        execl(self, self, "--serve-fd", fd.c_str(), "--compute-us", us.c_str(), "--threads", threads.c_str(),
              static_cast<char *>(nullptr));
        _exit(127);
    }
    close(input[0]);
    close(port_pipe[1]);
    stdin_pipe = input[1];
    char text[16] = {};
    const ssize_t n = read(port_pipe[0], text, sizeof text - 1);
    close(port_pipe[0]);
    return n > 0 ? std::atoi(text) : 0;
}

int measure(const options & opt) {
    int   stdin_pipe = -1;
    pid_t child      = -1;
    const int port = start_second_stage(opt, stdin_pipe, child);
    if (port == 0) {
        std::fprintf(stderr, "meshnet-grpc-hop: the second stage did not start\n");
        return 1;
    }
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    auto stub    = pb::ShardService::NewStub(channel);
    auto stage   = std::make_unique<asking_reactor>();
    stub->async()->Relay(&stage->context, stage.get());
    stage->StartCall();

    pb::RelayRequest request;
    request.add_steps()->mutable_boundary()->set_data(std::string(static_cast<size_t>(opt.bytes), '\0'));
    const int warm_up = 20;
    std::vector<double> beyond;
    for (int i = 0; i < warm_up + opt.rounds; ++i) {
        const auto started = hop_clock::now();
        compute(opt.compute_us, opt.threads);
        request.set_batch_id(static_cast<uint64_t>(i));
        if (!stage->round_trip(request)) {
            std::fprintf(stderr, "meshnet-grpc-hop: the stream failed\n");
            return 1;
        }
        if (i >= warm_up) {
            const double us = std::chrono::duration<double, std::micro>(hop_clock::now() - started).count();
            beyond.push_back(us - 2.0 * opt.compute_us);
        }
    }
    std::sort(beyond.begin(), beyond.end());
    std::printf("{\"median_us\": %.1f, \"p10_us\": %.1f, \"p90_us\": %.1f, \"rounds\": %d, \"compute_us\": %d, "
                "\"threads\": %d, \"bytes\": %d}\n",
                beyond[beyond.size() / 2], beyond[beyond.size() / 10], beyond[beyond.size() * 9 / 10],
                opt.rounds, opt.compute_us, opt.threads, opt.bytes);
    std::fflush(stdout);
    close(stdin_pipe); // the second stage shuts down (cancelling the stream) and exits
    waitpid(child, nullptr, 0);
    std::_Exit(0);     // the stream's reactor needs no orderly teardown here
}

bool parse(int argc, char ** argv, options & opt) {
    for (int i = 1; i < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h" || i + 1 >= argc) {
            return false;
        }
        const int value = std::atoi(argv[i + 1]);
        if (flag == "--compute-us" && value >= 0) opt.compute_us = value;
        else if (flag == "--threads" && value >= 1) opt.threads = value;
        else if (flag == "--rounds" && value >= 10) opt.rounds = value;
        else if (flag == "--bytes" && value >= 0) opt.bytes = value;
        else if (flag == "--serve-fd" && value >= 0) opt.serve_fd = value;
        else return false;
    }
    return true;
}

} // namespace

int main(int argc, char ** argv) {
    options opt;
    if (!parse(argc, argv, opt)) {
        std::fprintf(stderr,
            "usage: %s [--compute-us 3500] [--threads 2] [--rounds 400 (>= 10)] [--bytes 2304]\n"
            "Two processes take turns over one gRPC Relay stream as a 2-stage route's stages do\n"
            "while one session decodes; prints the microseconds per token beyond the compute.\n",
            argv[0]);
        return 2;
    }
    if (opt.serve_fd >= 0) {
        return serve(opt);
    }
    return measure(opt);
}
