# Declarations of the C++ core (csrc/) for the Cython wrappers in _core.pyx.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.string cimport string
from libcpp.utility cimport pair
from libcpp.vector cimport vector


cdef extern from "py_errors.hpp" namespace "pwt":
    void raise_py_error()
    void set_py_error_types(object gpu, object validation, object oom, object lost)


cdef extern from "buffer_cache.hpp" namespace "pwt" nogil:
    cdef cppclass MemoryStats:
        uint64_t allocated, peak_allocated, reserved, peak_reserved, cached, graph, driver_allocations, cache_hits

    cdef cppclass BufferCache:
        uint64_t empty()
        MemoryStats stats()
        void reset_peaks()


cdef extern from "bind_group_cache.hpp" namespace "pwt" nogil:
    cdef cppclass BindGroupStats:
        uint64_t hits, misses, entries

    cdef cppclass BindGroupCache:
        BindGroupStats stats()
        size_t capacity()


cdef extern from "transfer.hpp" namespace "pwt" nogil:
    cdef cppclass TransferSettings:
        uint64_t chunk_bytes, queue_write_max
        uint32_t slots, copy_threads

    cdef cppclass SlotInfo "pwt::Transfers::SlotInfo":
        string direction, state
        uint64_t bytes

    cdef cppclass Transfers:
        const TransferSettings& settings()
        vector[SlotInfo] report()
        void release()


cdef extern from "host_pool.hpp" namespace "pwt" nogil:
    cdef cppclass HostBlock "pwt::HostPool::Block":
        uint8_t* data
        uint64_t bytes

    cdef cppclass HostPoolStats "pwt::HostPool::Stats":
        uint64_t in_use, cached, limit, hits, misses

    cdef cppclass HostPool:
        @staticmethod
        shared_ptr[HostPool] glob "global"() except +raise_py_error
        HostBlock take(uint64_t nbytes) except +raise_py_error
        void give(HostBlock b)
        uint64_t release()
        HostPoolStats stats()

        @staticmethod
        uint64_t size_class(uint64_t nbytes)

    uint64_t host_pool_min_bytes "pwt::HostPool::kMinBytes"


cdef extern from "device.hpp" namespace "pwt" nogil:
    cdef cppclass AdapterSummary:
        uint32_t index
        string name, vendor, architecture, driver, backend, adapter_type
        uint32_t vendor_id, device_id, subgroup_min, subgroup_max

    cdef cppclass DeviceLimits:
        uint64_t max_storage_binding, max_buffer
        uint32_t max_workgroups_per_dim, max_invocations, max_workgroup_storage
        uint32_t storage_offset_alignment, uniform_offset_alignment, max_storage_buffers_per_stage

    cdef cppclass TileConfig:
        uint32_t bm, bn, bk, tm, tn, warp_w, lean_loop

    cdef cppclass GemmShape:
        uint32_t m, n, k
        bool ta, tb, tc

    cdef cppclass GemmPlan:
        TileConfig t
        uint32_t splits
        uint32_t workers
        double us

    cdef cppclass GemmTuning:
        bool enabled()
        string path()
        vector[pair[GemmShape, GemmPlan]] entries()

    cdef cppclass Device:
        GemmTuning& gemm_tuning()

        @staticmethod
        shared_ptr[Device] open(const string& selector) except +raise_py_error

        @staticmethod
        vector[AdapterSummary] list_adapters() except +raise_py_error
        const AdapterSummary& info()
        const DeviceLimits& limits()
        const vector[string]& features()
        bool lost()
        string lost_message()
        void wait(uint64_t submission) except +raise_py_error
        bool query() except +raise_py_error
        uint32_t spin_wait_us()
        void destroy() except +raise_py_error
        BufferCache& memory()
        BindGroupCache& bind_groups()
        Transfers& transfers()
        vector[pair[string, uint64_t]] resource_report()


cdef extern from "buffer.hpp" namespace "pwt" nogil:
    cdef cppclass Buffer:
        Buffer(shared_ptr[Device] dev, uint64_t nbytes, const string& label, uint64_t extra_usage,
               bool zeroed) except +raise_py_error
        Buffer(const Buffer& parent, uint64_t offset, uint64_t nbytes) except +raise_py_error
        uint64_t bytes()
        uint64_t offset()
        const void* raw()
        void upload(const void* src, uint64_t nbytes, uint64_t offset) except +raise_py_error
        void download(void* dst, uint64_t nbytes, uint64_t offset) except +raise_py_error


cdef extern from "recorder.hpp" namespace "pwt" nogil:
    cdef cppclass PassTimer
    cdef cppclass AdamWConfig:  # defined in ops.hpp
        float lr, beta1, beta2, eps, weight_decay, l2
    cdef cppclass Range:
        uint64_t size
    Range whole(const Buffer& b)
    cdef cppclass Rebind:
        Range src "from"
        Range to

    cdef cppclass StepGraph:
        size_t size()
        vector[string] kernel_names()

    cdef cppclass Recorder:
        Recorder(shared_ptr[Device] dev) except +raise_py_error
        void copy(const Buffer& src, uint64_t so, const Buffer& dst, uint64_t do,
                  uint64_t nbytes) except +raise_py_error
        void fill_zero(const Buffer& dst, uint64_t offset, uint64_t nbytes) except +raise_py_error
        size_t pending()
        uint64_t submit() except +raise_py_error
        void begin_capture() except +raise_py_error
        unique_ptr[StepGraph] end_capture() except +raise_py_error
        size_t captured()
        bool capturing()
        void replay(StepGraph& graph, const vector[Rebind]& rebinds, PassTimer* timer) except +raise_py_error
        Range stage(const void* data, uint64_t nbytes) except +raise_py_error
        void write(const Buffer& dst, uint64_t offset, const void* data, uint64_t nbytes) except +raise_py_error
        Range uniform_block(const void* data, size_t nbytes) except +raise_py_error


cdef extern from "timing.hpp" namespace "pwt" nogil:
    cdef cppclass PassTimer:
        PassTimer(shared_ptr[Device] dev, uint32_t max_passes) except +raise_py_error
        void time_next_pass(Recorder& r, uint32_t index) except +raise_py_error
        vector[double] read(Recorder& r, uint32_t passes) except +raise_py_error


cdef extern from "ops.hpp" namespace "pwt" nogil:
    cdef enum class Activation(uint32_t):
        pass

    void configure_gemm_tuning(Device& dev, bool enabled, const string& cache_dir) except +raise_py_error
    vector[GemmPlan] gemm_tune_candidates(const Device& dev, uint32_t m, uint32_t n, uint32_t k, bool ta,
                                          bool tb) except +raise_py_error
    void gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
              bool trans_a, bool trans_b, float alpha, float beta) except +raise_py_error
    void gemm_half(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                   bool trans_a, bool trans_b, float alpha, float beta) except +raise_py_error
    void gemm_batched(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t batch, uint32_t m,
                      uint32_t n, uint32_t k, bool ta, bool tb, float alpha, float beta) except +raise_py_error
    void cross_entropy_forward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                               const Buffer& row_loss, const Buffer& row_valid, const Buffer& out,
                               const Buffer& scale, uint32_t rows, uint32_t cols, int32_t ignore_index,
                               bool mean, bool half) except +raise_py_error
    void cross_entropy_backward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                                const Buffer& upstream, const Buffer& scale, const Buffer& dlogits, uint32_t rows,
                                uint32_t cols, int32_t ignore_index, bool per_row, float beta,
                                bool half) except +raise_py_error
    void gemm_bias_act(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& y,
                       const Buffer* preact, uint32_t m, uint32_t n, uint32_t k, bool trans_a, bool trans_b,
                       Activation act, bool half) except +raise_py_error
    void gemm_bias_residual(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& residual,
                            const Buffer& y, uint32_t m, uint32_t n, uint32_t k, bool trans_a,
                            bool trans_b, bool half, bool half_out) except +raise_py_error
    void linear_weight_grads(Recorder& r, const Buffer& dz, const Buffer& x, const Buffer& dw, const Buffer& db,
                             uint32_t rows, uint32_t out_features, uint32_t in_features,
                             float beta) except +raise_py_error
    void gemm_act_grad(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& preact, const Buffer& c, uint32_t m,
                       uint32_t n, uint32_t k, bool ta, bool tb, Activation act, bool half) except +raise_py_error
    void activation_backward(Recorder& r, const Buffer& dy, const Buffer& z, const Buffer& dz, uint64_t n,
                             Activation act, bool half) except +raise_py_error
    void bias_grad(Recorder& r, const Buffer& dz, const Buffer& db, uint32_t rows, uint32_t cols,
                   float beta, bool half) except +raise_py_error
    void adamw(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
               uint64_t n, const AdamWConfig& cfg, uint64_t step, const Buffer* clip,
               const Buffer* param_half) except +raise_py_error
    void grad_norm(Recorder& r, const vector[const Buffer*]& grads, const vector[uint64_t]& counts,
                   const Buffer& scratch, const Buffer& out, float max_norm) except +raise_py_error
    uint64_t grad_norm_scratch_floats(const Device& dev, const vector[uint64_t]& counts)
    void scale_by_clip(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& norm_out) except +raise_py_error
    const uint32_t kAdamSlotWords
    void adamw_prepare(Recorder& r, const Buffer& state, uint32_t first_slot, uint32_t slots, const Buffer& found_inf,
                       const AdamWConfig& cfg, const Buffer& hyper, uint32_t group) except +raise_py_error
    void adamw_device(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg,
                      const Buffer& exp_avg_sq, uint64_t n, const AdamWConfig& cfg, const Buffer& state,
                      uint32_t slot, const Buffer& found_inf, const Buffer* clip,
                      const Buffer* param_half) except +raise_py_error
    void scaler_unscale(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& scaler, const Buffer& found_inf,
                        bool first) except +raise_py_error
    void scaler_update(Recorder& r, const Buffer& scaler, float growth_factor, float backoff_factor,
                       uint32_t growth_interval, const float* new_scale) except +raise_py_error
    void layer_norm_forward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer* bias, const Buffer& y,
                            const Buffer& mean, const Buffer& rstd, uint32_t rows, uint32_t cols,
                            float eps, bint half) except +raise_py_error
    void layer_norm_backward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer& mean,
                             const Buffer& rstd, const Buffer& dy, const Buffer* dx, const Buffer* dweight,
                             const Buffer* dbias, uint32_t rows, uint32_t cols, float beta, float beta_weight,
                             float beta_bias, bint half) except +raise_py_error
    void rng_take(Recorder& r, const Buffer& state, const Buffer& key) except +raise_py_error
    void dropout(Recorder& r, const Buffer& x, const Buffer& key, const Buffer& y, uint64_t n, double p,
                 float beta, bint half) except +raise_py_error
    uint32_t dropout_threshold(double p) except +raise_py_error
    void cast(Recorder& r, const Buffer& src, const Buffer& dst, uint64_t n, bint to_half) except +raise_py_error

    cdef cppclass AttnView:
        uint64_t off
        uint32_t sb, sh, st
    cdef cppclass AttnShape:
        uint32_t batch, heads, t, tk, d
        bint causal
    void attention_forward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                           const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov,
                           const Buffer& lse, const AttnShape& s, float scale, uint32_t max_blocks,
                           bint half, const Buffer* kbias) except +raise_py_error
    void attention_backward(Recorder& r, const Buffer& q, const AttnView& qv, const Buffer& k, const AttnView& kv,
                            const Buffer& v, const AttnView& vv, const Buffer& out, const AttnView& ov,
                            const Buffer& dout, const AttnView& gv, const Buffer& lse, const Buffer& delta,
                            const Buffer& dq, const AttnView& dqv, const Buffer& dk, const AttnView& dkv,
                            const Buffer& dv, const AttnView& dvv, const AttnShape& s, float scale, float beta,
                            uint32_t max_blocks, bint half, const Buffer* kbias) except +raise_py_error
    void attention_decode(Recorder& r, const Buffer& qkv, const Buffer& k_cache, const Buffer& v_cache,
                          const Buffer& pos, const Buffer& out, uint32_t batch, uint32_t heads, uint32_t capacity,
                          uint32_t d, float scale) except +raise_py_error


cdef extern from "faults.hpp" namespace "pwt" nogil:
    void inject_invalid_binding(Recorder& r, const Buffer& buf) except +raise_py_error
    void inject_allocation_failures(const string& label, uint32_t after, uint32_t count)
    void inject_map_failure(int64_t after, bool lose_device)
    void inject_download_delay(uint32_t ms)


cdef extern from "tensor_ops.hpp" namespace "pwt" nogil:
    cdef enum class UnaryOp(uint32_t):
        pass
    cdef enum class BinaryOp(uint32_t):
        pass
    cdef enum class ReduceOp(uint32_t):
        pass

    void unary(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, uint64_t n, float a, float b,
               float beta, uint32_t half) except +raise_py_error
    void unary_backward(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, const Buffer& dy, const Buffer& dx,
                        uint64_t n, float a, float b, float beta, uint32_t half) except +raise_py_error
    void binary(Recorder& r, BinaryOp op, const Buffer& a, const Buffer& b, const Buffer& out,
                const vector[uint32_t]& shape, const vector[uint32_t]& a_strides, const vector[uint32_t]& b_strides,
                float beta, uint32_t half) except +raise_py_error
    void binary_backward(Recorder& r, BinaryOp op, uint32_t which, const Buffer& a, const Buffer& b, const Buffer& dy,
                         const Buffer& g, const vector[uint32_t]& shape, const vector[uint32_t]& a_strides,
                         const vector[uint32_t]& b_strides, float beta, uint32_t half) except +raise_py_error
    void where(Recorder& r, const Buffer& cond, const Buffer& a, const Buffer& b, const Buffer& out,
               const vector[uint32_t]& shape, const vector[uint32_t]& c_strides, const vector[uint32_t]& a_strides,
               const vector[uint32_t]& b_strides, float beta, uint32_t half) except +raise_py_error
    void strided_copy(Recorder& r, const Buffer& src, uint64_t src_off, const vector[uint32_t]& src_strides,
                      const Buffer& dst, uint64_t dst_off, const vector[uint32_t]& dst_strides,
                      const vector[uint32_t]& shape, float beta, uint32_t half) except +raise_py_error
    void fill(Recorder& r, const Buffer& out, uint64_t n, float value, bint half) except +raise_py_error
    void reduce_axis(Recorder& r, ReduceOp op, const Buffer& x, const Buffer& out, const Buffer* argmax, uint32_t outer,
                     uint32_t len, uint32_t inner, float scale, float beta, bint half) except +raise_py_error
    void max_backward(Recorder& r, const Buffer& dy, const Buffer& argmax, const Buffer& dx, uint32_t outer,
                      uint32_t len, uint32_t inner, float beta) except +raise_py_error
    void softmax(Recorder& r, const Buffer& x, const Buffer& y, uint32_t rows, uint32_t cols,
                 bool log, bint half) except +raise_py_error
    void softmax_backward(Recorder& r, const Buffer& y, const Buffer& dy, const Buffer& dx, uint32_t rows,
                          uint32_t cols, bool log, float beta, bint half) except +raise_py_error
    void next_token(Recorder& r, const Buffer& logits, const Buffer& tok, const Buffer& hist, const Buffer& pos,
                    uint32_t rows, uint32_t cols, uint32_t hist_cols) except +raise_py_error
    void embedding(Recorder& r, const Buffer& weight, const Buffer& ids, const Buffer& out, uint32_t n_ids,
                   uint32_t vocab, uint32_t dim) except +raise_py_error
    void embedding_backward(Recorder& r, const Buffer& dy, const Buffer& ids, const Buffer& dweight, uint32_t n_ids,
                            uint32_t vocab, uint32_t dim, float beta) except +raise_py_error
    void nll_pick(Recorder& r, const Buffer& x, const Buffer& labels, const Buffer& out, const Buffer& mask,
                  uint32_t rows, uint32_t cols, int32_t ignore_index) except +raise_py_error
    void nll_pick_backward(Recorder& r, const Buffer& dy, const Buffer& labels, const Buffer& dx, uint32_t rows,
                           uint32_t cols, int32_t ignore_index, float beta) except +raise_py_error


cdef extern from "shader_contract.hpp" namespace "pwt" nogil:
    cdef cppclass UniformField:
        string name, type
        uint32_t offset, size

    cdef cppclass UniformLayout:
        string name
        uint32_t size
        vector[UniformField] fields

    cdef cppclass ContractBinding:
        string shader, var, access, type
        uint32_t binding

    cdef cppclass ContractConstant:
        string shader, name
        uint32_t value

    vector[UniformLayout] uniform_layouts() except +raise_py_error
    vector[ContractBinding] contract_bindings() except +raise_py_error
    vector[ContractConstant] contract_constants() except +raise_py_error
