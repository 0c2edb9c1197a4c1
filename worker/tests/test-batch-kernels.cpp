// test-batch-kernels.cpp - around our ggml patches 0006-0008 (CPU kernels for decode
// steps of several sessions): the Q4_1 and Q8_0 dots over two rows and two columns equal
// one-row dots bit for bit, and a product over the few columns of a step (one per
// session) still gives each column exactly what it gets alone, for the test model's
// weight types (Q4_1 layers, Q8_0 output head), so a session's numbers do not depend on
// who shares its step. The same for F32 (patch 0011) and K-quant weights (0013), whose
// products of up to 8 columns a speculative verify step makes.
#include "service_test.h"

#include <ggml-cpu.h>
#include <ggml.h>

#include <cstring>
#include <random>
#include <vector>

namespace {

struct quantized {
    ggml_type type = GGML_TYPE_COUNT;
    int n = 0;
    std::vector<uint8_t> weights;     // rows of `type`
    std::vector<uint8_t> activations; // columns of its vec_dot_type
    size_t weight_row = 0, activation_row = 0;
};

// Rows of varied scale and offset (Q4_1 stores both), columns quantized as a matmul does.
quantized make(ggml_type type, int n, int rows, int columns, unsigned seed) {
    const auto * traits = ggml_get_type_traits_cpu(type);
    quantized q;
    q.type = type;
    q.n = n;
    q.weight_row     = ggml_row_size(type, n);
    q.activation_row = ggml_row_size(traits->vec_dot_type, n);
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(n) * rows);
    for (size_t i = 0; i < values.size(); ++i) {
        values[i] = uniform(gen) * static_cast<float>(1 + (i / n) % 5) + 0.25f * static_cast<float>((i / n) % 3);
    }
    q.weights.resize(q.weight_row * rows);
    ggml_quantize_chunk(type, values.data(), q.weights.data(), 0, rows, n, nullptr);
    q.activations.resize(q.activation_row * columns);
    const auto * activation = ggml_get_type_traits_cpu(traits->vec_dot_type);
    std::vector<float> column(n);
    for (int c = 0; c < columns; ++c) {
        for (auto & v : column) {
            v = 3.0f * uniform(gen);
        }
        activation->from_float(column.data(), q.activations.data() + q.activation_row * c, n);
    }
    return q;
}

float one(const quantized & q, int row, int column) {
    float out = 0;
    ggml_get_type_traits_cpu(q.type)->vec_dot(q.n, &out, 0,
        q.weights.data() + q.weight_row * row, 0, q.activations.data() + q.activation_row * column, 0, 1);
    return out;
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

} // namespace

TEST("the q4_1 and q8_0 dots over two rows and two columns equal single dots bit for bit") {
    ggml_cpu_init();
    if (!(ggml_cpu_has_avx2() && ggml_cpu_has_f16c() && ggml_cpu_has_fma())) { // what the patches cover
        std::printf("no AVX2, F16C and FMA: Q4_1 and Q8_0 dots take one row here, nothing to compare\n");
        return;
    }
    for (ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q8_0}) {
        const auto * traits = ggml_get_type_traits_cpu(type);
        CHECK_EQ(traits->nrows, int64_t(2));
        for (int n : {32, 576, 1536}) { // one block, SmolLM2's n_embd, its FFN width
            const quantized q = make(type, n, 8, 6, static_cast<unsigned>(n));
            int compared = 0, differing = 0;
            for (int row = 0; row + 1 < 8; row += 2) {
                for (int column = 0; column + 1 < 6; column += 2) {
                    float out[32] = {};
                    traits->vec_dot(n, out, 16, q.weights.data() + q.weight_row * row, q.weight_row,
                                    q.activations.data() + q.activation_row * column, q.activation_row, 2);
                    const float pairs[4][2] = {{out[0], one(q, row, column)}, {out[1], one(q, row + 1, column)},
                                               {out[16], one(q, row, column + 1)}, {out[17], one(q, row + 1, column + 1)}};
                    for (const auto & pair : pairs) {
                        ++compared;
                        differing += same_bits(pair[0], pair[1]) ? 0 : 1;
                    }
                }
            }
            if (differing != 0) {
                std::printf("  %s, n = %d: %d of %d differ\n", ggml_type_name(type), n, differing, compared);
            }
            CHECK_EQ(compared, 48);
            CHECK_EQ(differing, 0);
        }
    }
}

// Products through ggml's graph, as a model step runs them, 2 threads.
static std::vector<float> product(ggml_context * ctx, ggml_tensor * weights, const float * columns, int n_columns) {
    ggml_tensor * input = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, weights->ne[0], n_columns);
    std::memcpy(input->data, columns, ggml_nbytes(input));
    ggml_tensor * out = ggml_mul_mat(ctx, weights, input);
    ggml_cgraph * graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(graph, out);
    CHECK(ggml_graph_compute_with_ctx(ctx, graph, 2) == GGML_STATUS_SUCCESS);
    const auto * data = static_cast<const float *>(out->data);
    return std::vector<float>(data, data + weights->ne[1] * n_columns);
}

TEST("a step's product of 2 to 8 columns gives each column what it gets alone") {
    ggml_cpu_init();
    const int n = 768, rows = 256; // whole K-quant blocks of 256
    for (ggml_type type : {GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_F32, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
        ggml_init_params params = {256 * 1024 * 1024, nullptr, false};
        ggml_context * ctx = ggml_init(params);
        ggml_tensor * weights = ggml_new_tensor_2d(ctx, type, n, rows);
        std::mt19937 gen(11);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        std::vector<float> values(static_cast<size_t>(n) * rows);
        for (auto & v : values) {
            v = uniform(gen);
        }
        if (type == GGML_TYPE_F32) {
            std::memcpy(weights->data, values.data(), ggml_nbytes(weights));
        } else {
            ggml_quantize_chunk(type, values.data(), weights->data, 0, rows, n, nullptr);
        }
        std::vector<float> columns(static_cast<size_t>(n) * 8);
        for (auto & v : columns) {
            v = 2.0f * uniform(gen);
        }
        for (int n_columns : {2, 3, 4, 5, 6, 7, 8}) { // odd counts: pairs and a one-row column
            const std::vector<float> together = product(ctx, weights, columns.data(), n_columns);
            int differing = 0;
            for (int c = 0; c < n_columns; ++c) {
                const std::vector<float> alone = product(ctx, weights, columns.data() + n * c, 1);
                differing += std::memcmp(together.data() + rows * c, alone.data(), sizeof(float) * rows) != 0;
            }
            if (differing != 0) {
                std::printf("  %s, %d columns: %d differ from the column alone\n", ggml_type_name(type), n_columns, differing);
            }
            CHECK_EQ(differing, 0);
        }
        ggml_free(ctx);
    }
}

TEST_MAIN()
