#include "onednn.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "orochi/base/check.h"
#include "orochi/engine/ops.h"
#include "thread_pool.h"

namespace orochi::engine::cpu {
namespace {

// oneDNN runs on the calling thread's OpenMP team: the caller and as many threads as it borrowed
// from the pool, whose own helpers stay idle meanwhile, so the threads working still match the
// permits taken. From kOnednnGrain multiply-adds (or compares) per thread: the GEMM's grain
// (gemm_split.h), for the same reason.
constexpr int64_t kOnednnGrain = int64_t{1} << 18;

#if defined(__SANITIZE_THREAD__)
// libgomp is not built for ThreadSanitizer, which would read its team's barriers as races: under
// it, oneDNN runs on the calling thread alone (the pool's own threads are still checked).
constexpr bool kOpenMpTeams = false;
#else
constexpr bool kOpenMpTeams = true;
#endif

int OnednnHelpers(int64_t work) { return kOpenMpTeams ? HelpersFor(work, kOnednnGrain) : 0; }

int TeamOf(const BorrowedThreads& borrowed) {
  const int threads = 1 + borrowed.count();
  omp_set_num_threads(threads);
  return threads;
}

using dnnl::memory;
using Tag = memory::format_tag;

const dnnl::engine& CpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One convolution shape's primitives, made once and then run by any number of threads at once:
// every call brings its own scratchpad (oneDNN's library-owned one is not thread-safe) and its
// own buffers for the blocked layouts.
struct ConvPlan {
  dnnl::convolution_forward::primitive_desc descriptor;
  dnnl::convolution_forward primitive;
  // Reorders between the caller's plain NCHW / OIHW and oneDNN's chosen layouts, when they differ.
  std::optional<dnnl::reorder> src_in;
  std::optional<dnnl::reorder> weights_in;
  std::optional<dnnl::reorder> dst_out;
  std::optional<dnnl::reorder> residual_in;  // the residual into dst's layout, for the sum
  size_t scratchpad_bytes = 0;               // the largest any of them needs
};

// N, C, H, W, O, kh, kw, stride, padding, dilation (2 each), groups, whether there is a bias,
// the number of threads, whether a residual is added and whether ReLU follows.
using PlanKey = std::array<int64_t, 18>;

memory::dims Dims(std::initializer_list<int64_t> values) { return {values}; }

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

std::optional<dnnl::reorder> ReorderIfNeeded(const memory::desc& from, const memory::desc& to,
                                             size_t& scratchpad_bytes) {
  if (from == to) return std::nullopt;
  dnnl::reorder::primitive_desc descriptor(CpuEngine(), from, CpuEngine(), to, UserScratchpad());
  scratchpad_bytes = std::max(scratchpad_bytes, descriptor.scratchpad_desc().get_size());
  return dnnl::reorder(descriptor);
}

struct PlainDescs {
  memory::desc src, weights, bias, dst;
};

PlainDescs Plain(const PlanKey& key) {
  const auto [n, c, h, w, o, kh, kw] =
      std::array<int64_t, 7>{key[0], key[1], key[2], key[3], key[4], key[5], key[6]};
  const int64_t groups = key[13];
  const auto dt = memory::data_type::f32;
  const int64_t out_h = (h + 2 * key[9] - key[11] * (kh - 1) - 1) / key[7] + 1;
  const int64_t out_w = (w + 2 * key[10] - key[12] * (kw - 1) - 1) / key[8] + 1;
  PlainDescs plain;
  plain.src = memory::desc(Dims({n, c, h, w}), dt, Tag::nchw);
  plain.weights =
      groups == 1 ? memory::desc(Dims({o, c, kh, kw}), dt, Tag::oihw)
                  : memory::desc(Dims({groups, o / groups, c / groups, kh, kw}), dt, Tag::goihw);
  plain.bias = memory::desc(Dims({o}), dt, Tag::x);
  plain.dst = memory::desc(Dims({n, o, out_h, out_w}), dt, Tag::nchw);
  return plain;
}

std::shared_ptr<const ConvPlan> MakePlan(const PlanKey& key) {
  const PlainDescs plain = Plain(key);
  const bool bias = key[14] != 0;
  const bool residual = key[16] != 0;
  const bool relu = key[17] != 0;
  auto any = [](const memory::desc& desc) {
    return memory::desc(desc.dims(), desc.data_type(), Tag::any);
  };
  const memory::dims strides = {key[7], key[8]};
  const memory::dims padding = {key[9], key[10]};
  const memory::dims dilation = {key[11] - 1, key[12] - 1};  // oneDNN counts the gaps
  const dnnl::convolution_forward::desc conv(dnnl::prop_kind::forward_inference,
                                             dnnl::algorithm::convolution_direct, any(plain.src),
                                             any(plain.weights), bias ? plain.bias : memory::desc(),
                                             any(plain.dst), strides, dilation, padding, padding);
  dnnl::primitive_attr attr = UserScratchpad();
  // In PyTorch's order: relu(conv(x) + bias + residual). The sum post-op adds what dst holds
  // before the convolution writes it: the residual, put there first.
  dnnl::post_ops post_ops;
  if (residual) post_ops.append_sum(1.0F);
  if (relu) post_ops.append_eltwise(1.0F, dnnl::algorithm::eltwise_relu, 0.0F, 0.0F);
  attr.set_post_ops(post_ops);
  auto plan = std::make_shared<ConvPlan>();
  plan->descriptor = dnnl::convolution_forward::primitive_desc(conv, attr, CpuEngine());
  plan->primitive = dnnl::convolution_forward(plan->descriptor);
  size_t& scratchpad = plan->scratchpad_bytes;
  scratchpad = plan->descriptor.scratchpad_desc().get_size();
  plan->src_in = ReorderIfNeeded(plain.src, plan->descriptor.src_desc(), scratchpad);
  plan->weights_in = ReorderIfNeeded(plain.weights, plan->descriptor.weights_desc(), scratchpad);
  plan->dst_out = ReorderIfNeeded(plan->descriptor.dst_desc(), plain.dst, scratchpad);
  if (residual) {
    plan->residual_in = ReorderIfNeeded(plain.dst, plan->descriptor.dst_desc(), scratchpad);
  }
  return plan;
}

// Plans by shape (a model has a handful). oneDNN's own primitive cache would also find the
// primitives, but only after building a descriptor per call. Shapes come from requests, so the
// cache is bounded: past kMaxPlans one plan is dropped (calls running it keep their reference).
template <typename Plan, typename Key>
std::shared_ptr<const Plan> FindPlan(const Key& key,
                                     std::shared_ptr<const Plan> (*make)(const Key&)) {
  constexpr size_t kMaxPlans = 256;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const Plan>> plans;
  {
    std::lock_guard lock(mutex);
    if (auto found = plans.find(key); found != plans.end()) return found->second;
  }
  std::shared_ptr<const Plan> plan = make(key);  // outside the lock: JIT takes a while
  std::lock_guard lock(mutex);
  if (plans.size() >= kMaxPlans) plans.erase(plans.begin());
  return plans.try_emplace(key, plan).first->second;
}

Tensor Buffer(size_t bytes) {
  return Tensor::Empty({static_cast<int64_t>(bytes)}, DType::kUInt8, Device{});
}

// A calling thread's buffers for the blocked input and output and the scratchpad, kept between
// calls: under 1 MiB the allocator gives fresh pages each time, and faulting in three of them
// cost batch-1 convolutions more than the arithmetic. Each grows to the largest call's need.
class Workspace {
 public:
  enum Part { kSource, kDestination, kScratchpad, kParts };
  void* Get(Part part, size_t bytes) {
    Area& area = areas_[part];
    if (area.bytes < bytes) {
      area.data.reset(static_cast<std::byte*>(std::aligned_alloc(kAlignment, Rounded(bytes))));
      OROCHI_CHECK(area.data != nullptr, StatusCode::kResourceExhausted,
                   "conv2d: cannot allocate " << bytes << " bytes of workspace");
      area.bytes = Rounded(bytes);
    }
    return area.data.get();
  }

 private:
  static constexpr size_t kAlignment = 64;
  static size_t Rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }
  struct Free {
    void operator()(std::byte* data) const { std::free(data); }
  };
  struct Area {
    std::unique_ptr<std::byte, Free> data;
    size_t bytes = 0;
  };
  std::array<Area, kParts> areas_;
};

Workspace& ThreadWorkspace() {
  thread_local Workspace workspace;
  return workspace;
}

struct PreparedWeights {
  Tensor bytes;  // in the plan's weights layout
};

void Run(const dnnl::primitive& primitive, dnnl::stream& stream,
         const std::unordered_map<int, memory>& arguments) {
  primitive.execute(stream, arguments);
}

// `weight` (whose bytes `plain` describes) in `layout`: for a read-only weight the one copy kept
// with its storage, made by the first call that needs it; for a writable one, made now.
std::shared_ptr<const PreparedWeights> Prepare(const Tensor& weight, const memory& plain,
                                               const memory::desc& layout,
                                               const dnnl::reorder& reorder, dnnl::stream& stream,
                                               const memory& scratchpad) {
  auto prepare = [&]() -> Storage::Prepared {
    auto made = std::make_shared<PreparedWeights>();
    made->bytes = Buffer(layout.get_size());
    memory rearranged(layout, CpuEngine(), made->bytes.mutable_data());
    Run(reorder, stream,
        {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, rearranged}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
    stream.wait();  // complete before another thread can be handed it
    return made;
  };
  if (!weight.read_only()) return std::static_pointer_cast<const PreparedWeights>(prepare());
  // The layout's full description is the key: one weight may serve several plans.
  std::string key = "onednn weights@" + std::to_string(weight.storage_offset()) + ":";
  key.append(reinterpret_cast<const char*>(&layout.data), sizeof(layout.data));
  return std::static_pointer_cast<const PreparedWeights>(
      weight.storage()->PreparedLayout(key, prepare));
}

// One linear shape's matmul: input [rows, in] times the weight viewed as [in, out] (its [out, in]
// bytes read column-major), plus an optional [1, out] bias.
struct LinearPlan {
  dnnl::matmul::primitive_desc descriptor;
  dnnl::matmul primitive;
  memory::desc plain_weights;
  std::optional<dnnl::reorder> weights_in;
  size_t scratchpad_bytes = 0;
};

// rows, in, out, whether there is a bias, threads.
using LinearKey = std::array<int64_t, 5>;

std::shared_ptr<const LinearPlan> MakeLinearPlan(const LinearKey& key) {
  const auto [rows, in, out, bias, threads] = key;
  const auto f32 = memory::data_type::f32;
  auto plan = std::make_shared<LinearPlan>();
  plan->plain_weights = memory::desc(Dims({in, out}), f32, Tag::ba);
  const dnnl::matmul::desc matmul(
      memory::desc(Dims({rows, in}), f32, Tag::ab), memory::desc(Dims({in, out}), f32, Tag::any),
      bias != 0 ? memory::desc(Dims({1, out}), f32, Tag::ab) : memory::desc(),
      memory::desc(Dims({rows, out}), f32, Tag::ab));
  plan->descriptor = dnnl::matmul::primitive_desc(matmul, UserScratchpad(), CpuEngine());
  plan->primitive = dnnl::matmul(plan->descriptor);
  plan->scratchpad_bytes = plan->descriptor.scratchpad_desc().get_size();
  plan->weights_in =
      ReorderIfNeeded(plan->plain_weights, plan->descriptor.weights_desc(), plan->scratchpad_bytes);
  return plan;
}

memory ScratchpadMemory(size_t bytes) {
  return {memory::desc(Dims({static_cast<int64_t>(bytes)}), memory::data_type::u8, Tag::x),
          CpuEngine(), ThreadWorkspace().Get(Workspace::kScratchpad, bytes)};
}

// One max pooling shape's primitive on the plain NCHW layout (pooling reads each input once, so
// a reorder to a blocked layout and back would cost more than it saves).
struct PoolPlan {
  dnnl::pooling_forward::primitive_desc descriptor;
  dnnl::pooling_forward primitive;
  size_t scratchpad_bytes = 0;
};

// N, C, H, W, kernel, stride, padding (2 each), threads.
using PoolKey = std::array<int64_t, 11>;

std::shared_ptr<const PoolPlan> MakePoolPlan(const PoolKey& key) {
  const auto [n, c, h, w, kh, kw, sh, sw, ph, pw, threads] = key;
  const int64_t out_h = (h + 2 * ph - kh) / sh + 1;
  const int64_t out_w = (w + 2 * pw - kw) / sw + 1;
  const auto f32 = memory::data_type::f32;
  const dnnl::pooling_forward::desc pooling(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::pooling_max,
      memory::desc(Dims({n, c, h, w}), f32, Tag::nchw),
      memory::desc(Dims({n, c, out_h, out_w}), f32, Tag::nchw), Dims({sh, sw}), Dims({kh, kw}),
      Dims({ph, pw}), Dims({ph, pw}));
  auto plan = std::make_shared<PoolPlan>();
  plan->descriptor = dnnl::pooling_forward::primitive_desc(pooling, UserScratchpad(), CpuEngine());
  plan->primitive = dnnl::pooling_forward(plan->descriptor);
  plan->scratchpad_bytes = plan->descriptor.scratchpad_desc().get_size();
  return plan;
}

}  // namespace

void OnednnMaxPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                     std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                     Tensor& output) {
  const Shape& in = input.shape();
  const BorrowedThreads borrowed(OnednnHelpers(output.numel() * kernel[0] * kernel[1]));
  const int threads = TeamOf(borrowed);  // before the plan: see OnednnConv2d
  const PoolKey key{in[0],     in[1],     in[2],      in[3],      kernel[0], kernel[1],
                    stride[0], stride[1], padding[0], padding[1], threads};
  const std::shared_ptr<const PoolPlan> plan = FindPlan(key, MakePoolPlan);
  const dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  Run(plan->primitive, stream,
      {{DNNL_ARG_SRC, memory(plan->descriptor.src_desc(), engine, const_cast<void*>(input.data()))},
       {DNNL_ARG_DST, memory(plan->descriptor.dst_desc(), engine, output.mutable_data())},
       {DNNL_ARG_SCRATCHPAD, ScratchpadMemory(plan->scratchpad_bytes)}});
  stream.wait();
}

void OnednnConv2d(const Tensor& input, const Tensor& weight, const Tensor* bias,
                  const ConvGeometry& geometry, const ConvEpilogue& epilogue, Tensor& output) {
  const Shape& in = input.shape();
  const Shape& filters = weight.shape();
  // oneDNN sizes a primitive's work split for the calling thread's OpenMP team size when the
  // primitive is made, and runs it with that many threads: so the count is set before the plan
  // is found, and is part of its key.
  const BorrowedThreads borrowed(
      OnednnHelpers(output.numel() * (filters[1] * filters[2] * filters[3])));
  const int threads = TeamOf(borrowed);
  const PlanKey key{in[0],
                    in[1],
                    in[2],
                    in[3],
                    filters[0],
                    filters[2],
                    filters[3],
                    geometry.stride[0],
                    geometry.stride[1],
                    geometry.padding[0],
                    geometry.padding[1],
                    geometry.dilation[0],
                    geometry.dilation[1],
                    geometry.groups,
                    bias != nullptr ? 1 : 0,
                    threads,
                    epilogue.residual != nullptr ? 1 : 0,
                    epilogue.relu ? 1 : 0};
  const std::shared_ptr<const ConvPlan> plan = FindPlan(key, MakePlan);
  const PlainDescs plain = Plain(key);
  const dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  Workspace& workspace = ThreadWorkspace();
  const memory scratchpad = ScratchpadMemory(plan->scratchpad_bytes);
  auto plain_memory = [&](const memory::desc& desc, const void* data) {
    return memory(desc, engine, const_cast<void*>(data));  // oneDNN takes inputs as void*
  };

  memory src = plain_memory(plain.src, input.data());
  if (plan->src_in) {
    memory blocked(plan->descriptor.src_desc(), engine,
                   workspace.Get(Workspace::kSource, plan->descriptor.src_desc().get_size()));
    Run(*plan->src_in, stream,
        {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, blocked}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
    src = blocked;
  }

  memory weights = plain_memory(plain.weights, weight.data());
  std::shared_ptr<const PreparedWeights> prepared;
  if (plan->weights_in) {
    prepared = Prepare(weight, weights, plan->descriptor.weights_desc(), *plan->weights_in, stream,
                       scratchpad);
    weights = plain_memory(plan->descriptor.weights_desc(), prepared->bytes.data());
  }

  std::unordered_map<int, memory> arguments{
      {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_SCRATCHPAD, scratchpad}};
  if (bias != nullptr) {
    arguments.emplace(DNNL_ARG_BIAS, plain_memory(plain.bias, bias->data()));
  }
  memory dst = memory(plain.dst, engine, output.mutable_data());
  const auto residual_bytes = static_cast<size_t>(output.numel()) * sizeof(float);
  if (plan->dst_out) {
    memory blocked(plan->descriptor.dst_desc(), engine,
                   workspace.Get(Workspace::kDestination, plan->descriptor.dst_desc().get_size()));
    if (epilogue.residual != nullptr) {
      const memory residual = plain_memory(plain.dst, epilogue.residual->data());
      if (plan->residual_in) {
        Run(*plan->residual_in, stream,
            {{DNNL_ARG_FROM, residual}, {DNNL_ARG_TO, blocked}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
      } else {
        std::memcpy(blocked.get_data_handle(), epilogue.residual->data(), residual_bytes);
      }
    }
    arguments.emplace(DNNL_ARG_DST, blocked);
    Run(plan->primitive, stream, arguments);
    Run(*plan->dst_out, stream,
        {{DNNL_ARG_FROM, blocked}, {DNNL_ARG_TO, dst}, {DNNL_ARG_SCRATCHPAD, scratchpad}});
  } else {
    if (epilogue.residual != nullptr) {
      std::memcpy(output.mutable_data(), epilogue.residual->data(), residual_bytes);
    }
    arguments.emplace(DNNL_ARG_DST, dst);
    Run(plan->primitive, stream, arguments);
  }
  stream.wait();
}

bool PrefersOnednnLinear(const Tensor& input, const Tensor& weight) {
  return input.device().type == DeviceType::kCpu && input.dtype() == DType::kFloat32 &&
         weight.dtype() == DType::kFloat32 && weight.read_only() && weight.dim() == 2 &&
         weight.is_contiguous() &&
         input.numel() / std::max<int64_t>(1, weight.shape()[1]) >= kOnednnLinearMinRows &&
         input.numel() * weight.shape()[0] >= kOnednnLinearMinWork && weight.numel() > 0;
}

void OnednnLinear(const Tensor& input, const Tensor& weight, const Tensor* bias, Tensor& output) {
  const BorrowedThreads borrowed(OnednnHelpers(output.numel() * input.shape()[1]));
  const int threads = TeamOf(borrowed);  // before the plan: see OnednnConv2d
  const LinearKey key{input.shape()[0], input.shape()[1], weight.shape()[0],
                      bias != nullptr ? 1 : 0, threads};
  const std::shared_ptr<const LinearPlan> plan = FindPlan(key, MakeLinearPlan);
  const dnnl::engine& engine = CpuEngine();
  dnnl::stream stream(engine);
  const memory scratchpad = ScratchpadMemory(plan->scratchpad_bytes);
  auto wrap = [&](const memory::desc& desc, const void* data) {
    return memory(desc, engine, const_cast<void*>(data));  // oneDNN takes inputs as void*
  };
  memory weights = wrap(plan->plain_weights, weight.data());
  std::shared_ptr<const PreparedWeights> prepared;
  if (plan->weights_in) {
    prepared = Prepare(weight, weights, plan->descriptor.weights_desc(), *plan->weights_in, stream,
                       scratchpad);
    weights = wrap(plan->descriptor.weights_desc(), prepared->bytes.data());
  }
  std::unordered_map<int, memory> arguments{
      {DNNL_ARG_SRC, wrap(plan->descriptor.src_desc(), input.data())},
      {DNNL_ARG_WEIGHTS, weights},
      {DNNL_ARG_DST, memory(plan->descriptor.dst_desc(), engine, output.mutable_data())},
      {DNNL_ARG_SCRATCHPAD, scratchpad}};
  if (bias != nullptr) {
    arguments.emplace(DNNL_ARG_BIAS, wrap(plan->descriptor.bias_desc(), bias->data()));
  }
  Run(plan->primitive, stream, arguments);
  stream.wait();
}

}  // namespace orochi::engine::cpu
