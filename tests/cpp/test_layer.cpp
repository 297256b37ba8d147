// The layer family's kernels (csrc/recops/layer/kernels/): counter_dropout's mask from its
// definition on every instruction set, the fused layer input and output in double against plain
// loops (forward) and finite differences of them (backward), with strided rows and several thread
// counts, and each instruction set's fp32 kernels against the double ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "recops/layer/kernels/layer_kernels.h"
#include "test_util.h"

namespace recops::layer::kernels {
namespace {

using test::ScopedThreads;

bool kept(int64_t seed, int64_t offset, double p, int64_t r, int64_t j) {
  const CounterRow row = CounterRow::make(stream_seed(seed, offset), static_cast<uint64_t>(r));
  return (row.bits(static_cast<uint32_t>(j)) >> 8) >= keep_threshold(p);
}

class LayerVariants : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(LayerVariants, DropoutMaskFollowsItsDefinitionForAnyThreadCount) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  const int64_t rows = 300, cols = 37, ld = 40;
  std::vector<float> x(rows * ld, 2.0f);
  const auto key = DropoutKey::make(5, 3, 0.25);
  for (int threads : {1, 3}) {
    ScopedThreads scoped(threads);
    std::vector<float> out(rows * cols, -1.0f);
    layer_kernels<float>(GetParam()).dropout(x.data(), ld, out.data(), cols, rows, cols, key);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        ASSERT_EQ(out[r * cols + j], kept(5, 3, 0.25, r, j) ? 2.0f / 0.75f : 0.0f) << r << "," << j;
      }
    }
  }
}

// n doubles scale * u + shift, u drawn uniformly from [-1, 1] with a fixed seed.
std::vector<double> random_doubles(int64_t n, uint32_t seed, double scale, double shift) {
  const std::vector<float> f = test::random_floats(n, seed);
  std::vector<double> d(f.size());
  for (size_t i = 0; i < f.size(); ++i) d[i] = scale * f[i] + shift;
  return d;
}

// analytic against the central difference of loss() in values[index].
template <typename Loss>
void expect_finite_difference(std::vector<double>& values, int64_t index, double analytic,
                              const Loss& loss, const char* what) {
  const double h = 1e-5, saved = values[index];
  values[index] = saved + h;
  const double up = loss();
  values[index] = saved - h;
  const double down = loss();
  values[index] = saved;
  EXPECT_NEAR(analytic, (up - down) / (2 * h), 1e-6 * (1 + std::abs(analytic))) << what << index;
}

// The problem's data, double, row-major with leading dimensions wider than the rows.
struct Data {
  int64_t rows = 70, width = 12, dim = 9, ld_x = 10, ld_u = 15, ld_a = 13;
  std::vector<double> x, u, a, w, b;
  Data() {
    x = random_doubles(rows * ld_x, 1, 1.0, 0.0);
    u = random_doubles(rows * ld_u, 2, 1.0, 0.0);
    a = random_doubles(rows * ld_a, 3, 2.0, 0.5);
    w = random_doubles(dim * width, 4, 0.5, 0.0);
    b = random_doubles(dim, 5, 1.0, 0.0);
  }
  OutputProblem<double> problem(Norm norm, double p) const {
    return OutputProblem<double>{
        rows,     width, dim,      x.data(), ld_x, u.data(), ld_u,
        a.data(), ld_a,  w.data(), b.data(), norm, 1e-6,     DropoutKey::make(9, 1, p)};
  }
};

// out = x + dropout(u * norm(a)) W^T + b by plain loops.
std::vector<double> reference_forward(const OutputProblem<double>& p, double rate) {
  std::vector<double> out(p.rows * p.dim);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* a = p.attn + r * p.ld_attn;
    double mean = 0, var = 0;
    if (p.norm == Norm::kLayer) {
      for (int64_t j = 0; j < p.width; ++j) mean += a[j] / p.width;
    }
    for (int64_t j = 0; j < p.width; ++j) var += (a[j] - mean) * (a[j] - mean) / p.width;
    std::vector<double> g(p.width);
    for (int64_t j = 0; j < p.width; ++j) {
      const double f = kept(9, 1, rate, r, j) ? 1 / (1 - rate) : 0;
      g[j] = p.u[r * p.ld_u + j] * (a[j] - mean) / std::sqrt(var + p.eps) * f;
    }
    for (int64_t d = 0; d < p.dim; ++d) {
      double s = p.x[r * p.ld_x + d] + p.bias[d];
      for (int64_t j = 0; j < p.width; ++j) s += g[j] * p.weight[d * p.width + j];
      out[r * p.dim + d] = s;
    }
  }
  return out;
}

double loss(const OutputProblem<double>& p, double rate, const std::vector<double>& grad) {
  const std::vector<double> out = reference_forward(p, rate);
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * grad[i];
  return s;
}

class LayerOutput : public ::testing::TestWithParam<Norm> {};

TEST_P(LayerOutput, ForwardEqualsLoopsAndBackwardEqualsFiniteDifferences) {
  const double rate = 0.3;
  Data data;
  const OutputProblem<double> p = data.problem(GetParam(), rate);
  const std::vector<float> g32 = test::random_floats(p.rows * p.dim, 6);
  const std::vector<double> grad(g32.begin(), g32.end());
  std::vector<double> first_u;
  for (int threads : {1, 3}) {
    ScopedThreads scoped(threads);
    std::vector<double> out(p.rows * p.dim);
    layer_kernels<double>().output_forward(p, out.data(), p.dim);
    test::expect_near_all(out, reference_forward(p, rate), 1e-12, "out");

    std::vector<double> du(p.rows * p.width), da(du.size()), dw(p.dim * p.width), db(p.dim);
    layer_kernels<double>().output_backward(
        p, grad.data(), p.dim, OutputGrads<double>{du.data(), da.data(), dw.data(), db.data()});
    if (first_u.empty()) first_u = du;
    EXPECT_EQ(du, first_u);  // per row, whatever the thread count
    // Central differences of the loops' loss, at a sample of each input's elements.
    const auto output_loss = [&] { return loss(data.problem(GetParam(), rate), rate, grad); };
    for (int64_t r : {0L, 33L, 69L}) {
      for (int64_t j : {0L, 5L, 11L}) {
        expect_finite_difference(data.u, r * data.ld_u + j, du[r * p.width + j], output_loss, "u ");
        expect_finite_difference(data.a, r * data.ld_a + j, da[r * p.width + j], output_loss,
                                 "attn ");
      }
    }
    for (int64_t i : {0L, 50L, 107L})
      expect_finite_difference(data.w, i, dw[i], output_loss, "weight ");
    for (int64_t d : {0L, 8L}) expect_finite_difference(data.b, d, db[d], output_loss, "bias ");
  }
}

INSTANTIATE_TEST_SUITE_P(Norms, LayerOutput, ::testing::Values(Norm::kLayer, Norm::kRms));

// silu(norm(x) W + b) by plain loops.
std::vector<double> reference_input(const InputProblem<double>& p) {
  std::vector<double> out(p.rows * p.width);
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* x = p.x + r * p.ld_x;
    double mean = 0, var = 0;
    if (p.norm == Norm::kLayer) {
      for (int64_t d = 0; d < p.dim; ++d) mean += x[d] / p.dim;
    }
    for (int64_t d = 0; d < p.dim; ++d) var += (x[d] - mean) * (x[d] - mean) / p.dim;
    for (int64_t j = 0; j < p.width; ++j) {
      double z = p.bias[j];
      for (int64_t d = 0; d < p.dim; ++d) {
        z += (x[d] - mean) / std::sqrt(var + p.eps) * p.weight[d * p.width + j];
      }
      out[r * p.width + j] = z / (1 + std::exp(-z));
    }
  }
  return out;
}

// A row-major matrix of `cols` columns (row stride cols) as one column piece.
template <typename P>
struct OnePiece {
  P data;
  int64_t cols;
  ColumnPieces<P> view() const { return {1, &data, &cols, &cols}; }
};

class LayerInput : public ::testing::TestWithParam<Norm> {};

TEST_P(LayerInput, ForwardEqualsLoopsAndBackwardEqualsFiniteDifferences) {
  const int64_t rows = 70, dim = 9, width = 14, ld_x = 11;
  std::vector<double> x = random_doubles(rows * ld_x, 11, 2.0, 0.5),
                      w = random_doubles(dim * width, 12, 0.6, 0.0),
                      b = random_doubles(width, 13, 1.0, 0.0);
  auto problem = [&] {
    return InputProblem<double>{rows,     dim,      width,      x.data(), ld_x,
                                w.data(), b.data(), GetParam(), 1e-6};
  };
  const std::vector<double> grad = random_doubles(rows * width, 14, 1.0, 0.0);
  auto input_loss = [&] {
    const std::vector<double> out = reference_input(problem());
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * grad[i];
    return s;
  };
  for (int threads : {1, 3}) {
    ScopedThreads scoped(threads);
    std::vector<double> out(rows * width);
    layer_kernels<double>().input_forward(problem(), OnePiece<double*>{out.data(), width}.view());
    test::expect_near_all(out, reference_input(problem()), 1e-12, "out");
    std::vector<double> dx(rows * dim), dw(dim * width), db(width);
    layer_kernels<double>().input_backward(problem(),
                                           OnePiece<const double*>{grad.data(), width}.view(),
                                           dx.data(), dw.data(), db.data());
    for (int64_t r : {0L, 40L, 69L}) {
      for (int64_t d : {0L, 4L, 8L})
        expect_finite_difference(x, r * ld_x + d, dx[r * dim + d], input_loss, "x ");
    }
    for (int64_t i : {0L, 60L, 125L}) expect_finite_difference(w, i, dw[i], input_loss, "weight ");
    for (int64_t j : {0L, 13L}) expect_finite_difference(b, j, db[j], input_loss, "bias ");
  }
}

// The output written as column pieces (one empty, row strides past their columns) holds the
// one-piece output's columns, and the backward from pieces equals the backward from one piece.
TEST_P(LayerInput, ColumnPiecesEqualOnePiece) {
  const int64_t rows = 70, dim = 9, width = 14;
  const std::vector<double> x = random_doubles(rows * dim, 31, 2.0, 0.5),
                            w = random_doubles(dim * width, 32, 0.6, 0.0),
                            grad = random_doubles(rows * width, 33, 1.0, 0.0);
  const InputProblem<double> p{rows,     dim,     width,      x.data(), dim,
                               w.data(), nullptr, GetParam(), 1e-6};
  const LayerKernels<double>& k = layer_kernels<double>();
  std::vector<double> out(rows * width), dx(rows * dim), dw(dim * width);
  k.input_forward(p, OnePiece<double*>{out.data(), width}.view());
  k.input_backward(p, OnePiece<const double*>{grad.data(), width}.view(), dx.data(), dw.data(),
                   nullptr);

  const int64_t cols[3] = {5, 0, 9}, ld[3] = {7, 1, 12}, first[3] = {0, 5, 5};
  std::vector<double> pieces[3], grads[3];
  double* out_data[3];
  const double* grad_data[3];
  for (int j = 0; j < 3; ++j) {
    pieces[j].assign(rows * ld[j], -1.0);
    grads[j].assign(rows * ld[j], 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols[j]; ++c)
        grads[j][r * ld[j] + c] = grad[r * width + first[j] + c];
    }
    out_data[j] = pieces[j].data();
    grad_data[j] = grads[j].data();
  }
  k.input_forward(p, ColumnPieces<double*>{3, out_data, cols, ld});
  for (int j = 0; j < 3; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ld[j]; ++c) {
        const double want = c < cols[j] ? out[r * width + first[j] + c] : -1.0;
        ASSERT_EQ(pieces[j][r * ld[j] + c], want) << "piece " << j << " row " << r << " col " << c;
      }
    }
  }
  std::vector<double> dx_pieces(rows * dim), dw_pieces(dim * width);
  k.input_backward(p, ColumnPieces<const double*>{3, grad_data, cols, ld}, dx_pieces.data(),
                   dw_pieces.data(), nullptr);
  EXPECT_EQ(dx_pieces, dx);
  EXPECT_EQ(dw_pieces, dw);
}

INSTANTIATE_TEST_SUITE_P(Norms, LayerInput, ::testing::Values(Norm::kLayer, Norm::kRms));

std::vector<float> as_floats(const std::vector<double>& d) {
  return {d.begin(), d.end()};
}

// The fp32 kernels of an instruction set against the double ones on the same values: a model's
// sizes (widths not multiples of the products' granule, a last block of 3 rows), both norms.
TEST_P(LayerVariants, Fp32KernelsEqualDoubleKernels) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  const LayerKernels<float>& f = layer_kernels<float>(GetParam());
  const LayerKernels<double>& d = layer_kernels<double>();
  const int64_t rows = 131, dim = 50, width = 200;
  const std::vector<double> x = random_doubles(rows * dim, 21, 2.0, 0.5),
                            w = random_doubles(dim * width, 22, 0.2, 0.0),
                            b = random_doubles(width, 23, 1.0, 0.0),
                            g = random_doubles(rows * width, 24, 1.0, 0.0);
  const std::vector<float> xf = as_floats(x), wf = as_floats(w), bf = as_floats(b),
                           gf = as_floats(g);
  const double tol = 2e-4;
  for (const Norm norm : {Norm::kLayer, Norm::kRms}) {
    const InputProblem<double> pd{rows, dim, width, x.data(), dim, w.data(), b.data(), norm, 1e-6};
    const InputProblem<float> pf{rows,      dim,       width, xf.data(), dim,
                                 wf.data(), bf.data(), norm,  1e-6};
    std::vector<double> out(rows * width), dx(rows * dim), dw(dim * width), db(width);
    std::vector<float> outf(out.size()), dxf(dx.size()), dwf(dw.size()), dbf(db.size());
    d.input_forward(pd, OnePiece<double*>{out.data(), width}.view());
    f.input_forward(pf, OnePiece<float*>{outf.data(), width}.view());
    test::expect_near_all(std::vector<double>(outf.begin(), outf.end()), out, tol, "input out");
    d.input_backward(pd, OnePiece<const double*>{g.data(), width}.view(), dx.data(), dw.data(),
                     db.data());
    f.input_backward(pf, OnePiece<const float*>{gf.data(), width}.view(), dxf.data(), dwf.data(),
                     dbf.data());
    test::expect_near_all(std::vector<double>(dxf.begin(), dxf.end()), dx, tol, "input dx");
    test::expect_near_all(std::vector<double>(dwf.begin(), dwf.end()), dw, tol * 4, "input dw");
    test::expect_near_all(std::vector<double>(dbf.begin(), dbf.end()), db, tol * 4, "input db");

    // The output: x, u, attn [rows, dim], W [dim, dim].
    const std::vector<double> u = random_doubles(rows * dim, 25, 1.0, 0.0),
                              a = random_doubles(rows * dim, 26, 2.0, 0.5),
                              wo = random_doubles(dim * dim, 27, 0.3, 0.0),
                              go = random_doubles(rows * dim, 28, 1.0, 0.0);
    const std::vector<float> uf = as_floats(u), af = as_floats(a), wof = as_floats(wo),
                             gof = as_floats(go);
    const DropoutKey key = DropoutKey::make(3, 2, 0.2);
    const OutputProblem<double> od{rows,     dim, dim,       x.data(), dim,  u.data(), dim,
                                   a.data(), dim, wo.data(), b.data(), norm, 1e-6,     key};
    const OutputProblem<float> of{rows,      dim, dim,        xf.data(), dim,  uf.data(), dim,
                                  af.data(), dim, wof.data(), bf.data(), norm, 1e-6,      key};
    std::vector<double> o(rows * dim), du(rows * dim), da(du.size()), dwo(dim * dim), dbo(dim);
    std::vector<float> of32(o.size()), duf(du.size()), daf(du.size()), dwof(dwo.size()),
        dbof(dbo.size());
    d.output_forward(od, o.data(), dim);
    f.output_forward(of, of32.data(), dim);
    test::expect_near_all(std::vector<double>(of32.begin(), of32.end()), o, tol, "output out");
    d.output_backward(od, go.data(), dim,
                      OutputGrads<double>{du.data(), da.data(), dwo.data(), dbo.data()});
    f.output_backward(of, gof.data(), dim,
                      OutputGrads<float>{duf.data(), daf.data(), dwof.data(), dbof.data()});
    test::expect_near_all(std::vector<double>(duf.begin(), duf.end()), du, tol, "output du");
    test::expect_near_all(std::vector<double>(daf.begin(), daf.end()), da, tol, "output da");
    test::expect_near_all(std::vector<double>(dwof.begin(), dwof.end()), dwo, tol * 4, "output dw");
    test::expect_near_all(std::vector<double>(dbof.begin(), dbof.end()), dbo, tol * 4, "output db");
  }
}

// The feed-forward stage's fp32 kernels of an instruction set against the double ones (the double
// ones against PyTorch's composition: tests/test_layer.py).
TEST_P(LayerVariants, Fp32FeedForwardEqualsDouble) {
  RECOPS_SKIP_UNLESS_CPU_RUNS(GetParam());
  const int64_t rows = 131, dim = 50, hidden = 50;
  const std::vector<double> x = random_doubles(rows * dim, 31, 2.0, 0.5),
                            gate = random_doubles(hidden * dim, 32, 0.3, 0.0),
                            up = random_doubles(hidden * dim, 33, 0.3, 0.0),
                            down = random_doubles(dim * hidden, 34, 0.3, 0.0),
                            g = random_doubles(rows * dim, 35, 1.0, 0.0);
  const std::vector<float> xf = as_floats(x), gatef = as_floats(gate), upf = as_floats(up),
                           downf = as_floats(down), gf = as_floats(g);
  const DropoutKey key = DropoutKey::make(8, 0, 0.2);
  const FfnProblem<double> pd{rows,      dim,         hidden,     x.data(), dim, gate.data(),
                              up.data(), down.data(), Norm::kRms, 1e-6,     key};
  const FfnProblem<float> pf{rows,       dim,          hidden,     xf.data(), dim, gatef.data(),
                             upf.data(), downf.data(), Norm::kRms, 1e-6,      key};
  std::vector<double> out(rows * dim), dx(out.size()), dg(hidden * dim), du(dg.size()),
      dd(dim * hidden);
  std::vector<float> outf(out.size()), dxf(out.size()), dgf(dg.size()), duf(dg.size()),
      ddf(dd.size());
  layer_kernels<double>().ffn_forward(pd, out.data(), dim);
  layer_kernels<float>(GetParam()).ffn_forward(pf, outf.data(), dim);
  test::expect_near_all(std::vector<double>(outf.begin(), outf.end()), out, 2e-4, "ffn out");
  layer_kernels<double>().ffn_backward(
      pd, g.data(), dim, FfnGrads<double>{dx.data(), dg.data(), du.data(), dd.data()});
  layer_kernels<float>(GetParam())
      .ffn_backward(pf, gf.data(), dim,
                    FfnGrads<float>{dxf.data(), dgf.data(), duf.data(), ddf.data()});
  test::expect_near_all(std::vector<double>(dxf.begin(), dxf.end()), dx, 2e-4, "ffn dx");
  test::expect_near_all(std::vector<double>(dgf.begin(), dgf.end()), dg, 8e-4, "ffn dgate");
  test::expect_near_all(std::vector<double>(duf.begin(), duf.end()), du, 8e-4, "ffn dup");
  test::expect_near_all(std::vector<double>(ddf.begin(), ddf.end()), dd, 8e-4, "ffn ddown");
}

INSTANTIATE_TEST_SUITE_P(Isa, LayerVariants,
                         ::testing::Values(CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const auto& info) { return std::string(test::isa_name(info.param)); });

}  // namespace
}  // namespace recops::layer::kernels
