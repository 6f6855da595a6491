# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin wrappers over the C++ core. The Python layer (tensor.py, ops.py, ...)
does argument checking and shape logic; these wrappers move bytes and record
kernels. Every call that can wait on the GPU releases the GIL."""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp.memory cimport shared_ptr, unique_ptr
from libcpp.string cimport string
from libcpp.utility cimport move, pair
from libcpp.vector cimport vector

from ._corelib cimport (
    Activation, AdamWConfig, Buffer, Device, PassTimer, Rebind, Recorder, StepGraph, set_py_error_types, whole,
)
from . cimport _corelib as c


class GpuError(RuntimeError):
    """The GPU or wgpu refused an operation."""


class ValidationError(GpuError):
    """wgpu validation failed (malformed binding, size or usage)."""


class OutOfMemoryError(GpuError, MemoryError):
    """The device could not allocate the requested memory."""


class DeviceLostError(GpuError):
    """The device was lost or destroyed; create a new pywgtrain.Device."""


set_py_error_types(GpuError, ValidationError, OutOfMemoryError, DeviceLostError)


def _s(string v):
    return v.decode("utf-8", "replace")


cdef dict _plan(const c.GemmPlan& p):
    return {"tiles": (p.t.bm, p.t.bn, p.t.bk, p.t.tm, p.t.tn, p.t.warp_w, p.t.lean_loop), "splits": p.splits,
            "stream_k_workers": p.workers, "us": p.us}


cdef dict _summary(const c.AdapterSummary& s):
    return {
        "index": s.index, "name": _s(s.name), "vendor": _s(s.vendor), "architecture": _s(s.architecture),
        "driver": _s(s.driver), "backend": _s(s.backend), "adapter_type": _s(s.adapter_type),
        "vendor_id": s.vendor_id, "device_id": s.device_id,
        "subgroup_min_size": s.subgroup_min, "subgroup_max_size": s.subgroup_max,
    }


def list_adapters():
    cdef vector[c.AdapterSummary] v
    with nogil:
        v = Device.list_adapters()
    return [_summary(s) for s in v]


cdef class _Device:
    cdef shared_ptr[Device] ptr

    def __cinit__(self, str selector not None=""):
        cdef string sel = selector.encode()
        with nogil:
            self.ptr = Device.open(sel)

    @property
    def info(self):
        return _summary(self.ptr.get().info())

    @property
    def spin_wait_us(self):
        return self.ptr.get().spin_wait_us()

    @property
    def limits(self):
        cdef const c.DeviceLimits* lim = &self.ptr.get().limits()
        return {
            "max_storage_buffer_binding_size": lim.max_storage_binding,
            "max_buffer_size": lim.max_buffer,
            "max_compute_workgroups_per_dimension": lim.max_workgroups_per_dim,
            "max_compute_invocations_per_workgroup": lim.max_invocations,
            "max_compute_workgroup_storage_size": lim.max_workgroup_storage,
            "min_storage_buffer_offset_alignment": lim.storage_offset_alignment,
            "min_uniform_buffer_offset_alignment": lim.uniform_offset_alignment,
            "max_storage_buffers_per_shader_stage": lim.max_storage_buffers_per_stage,
        }

    @property
    def features(self):
        cdef vector[string] names = self.ptr.get().features()
        return [_s(f) for f in names]

    @property
    def lost(self):
        return self.ptr.get().lost()

    def wait(self, uint64_t submission):
        with nogil:
            self.ptr.get().wait(submission)

    def query(self):
        return self.ptr.get().query()

    def destroy(self):
        self.ptr.get().destroy()

    def resource_report(self):
        return {_s(k): v for k, v in self.ptr.get().resource_report()}

    def memory_stats(self, bint reset_peak=False):
        cdef c.MemoryStats s = self.ptr.get().memory().stats()
        cdef c.BindGroupStats g = self.ptr.get().bind_groups().stats()
        if reset_peak:
            self.ptr.get().memory().reset_peaks()
        return {"allocated_bytes": s.allocated, "peak_allocated_bytes": s.peak_allocated,
                "reserved_bytes": s.reserved, "peak_reserved_bytes": s.peak_reserved, "cached_bytes": s.cached,
                "graph_bytes": s.graph,
                "driver_allocations": s.driver_allocations, "cache_hits": s.cache_hits,
                "bind_group_hits": g.hits, "bind_group_misses": g.misses, "bind_groups_cached": g.entries}

    def empty_cache(self):
        with nogil:  # waits for a download in flight on another thread
            self.ptr.get().transfers().release()
        return self.ptr.get().memory().empty()

    @property
    def transfer_settings(self):
        """The host-transfer tunables this device read when it opened (csrc/transfer.hpp)."""
        cdef const c.TransferSettings* t = &self.ptr.get().transfers().settings()
        return {"chunk_bytes": t.chunk_bytes, "slots": t.slots, "copy_threads": t.copy_threads,
                "queue_write_max": t.queue_write_max}

    def staging_report(self):
        """(direction, map state, bytes) of each host-transfer staging buffer, for tests."""
        cdef vector[c.SlotInfo] slots = self.ptr.get().transfers().report()
        return [(_s(i.direction), _s(i.state), i.bytes) for i in slots]

    def configure_gemm_tuning(self, bint enabled, str cache_dir not None):
        c.configure_gemm_tuning(self.ptr.get()[0], enabled, cache_dir.encode())

    @property
    def gemm_tuning_enabled(self):
        return self.ptr.get().gemm_tuning().enabled()

    @property
    def gemm_tuning_path(self):
        return _s(self.ptr.get().gemm_tuning().path())

    def gemm_plans(self):
        cdef vector[pair[c.GemmShape, c.GemmPlan]] entries = self.ptr.get().gemm_tuning().entries()
        return [
            {"m": e.first.m, "n": e.first.n, "k": e.first.k, "ta": e.first.ta, "tb": e.first.tb, "tc": e.first.tc,
             **_plan(e.second)}
            for e in entries
        ]

    def gemm_tune_candidates(self, uint32_t m, uint32_t n, uint32_t k, bint ta, bint tb):
        """The plans the tuner would time for a packed product, the heuristic's first (for tests)."""
        cdef vector[c.GemmPlan] plans = c.gemm_tune_candidates(self.ptr.get()[0], m, n, k, ta, tb)
        return [_plan(p) for p in plans]

    def grad_norm_scratch_floats(self, counts):
        cdef vector[uint64_t] v = counts
        return c.grad_norm_scratch_floats(self.ptr.get()[0], v)


cdef class _Buffer:
    cdef shared_ptr[Buffer] ptr
    cdef readonly _Device device

    def __cinit__(self, _Device device not None, uint64_t nbytes, str label not None="pywgtrain.tensor",
                  _Buffer parent=None, uint64_t offset=0, bint zeroed=False):
        """Uninitialized memory from the device's cache; ``zeroed``: a new, zero-filled buffer."""
        cdef string lab = label.encode()
        self.device = device
        if parent is not None:
            self.ptr.reset(new Buffer(parent.ptr.get()[0], offset, nbytes))
            return
        with nogil:
            self.ptr.reset(new Buffer(device.ptr, nbytes, lab, 0, zeroed))

    def view(self, uint64_t offset, uint64_t nbytes):
        """A buffer sharing this one's memory from byte `offset` (storage-aligned)."""
        return _Buffer(self.device, nbytes, parent=self, offset=offset)

    def shares_memory(self, _Buffer other not None):
        """Whether both are views of the same wgpu buffer."""
        return self.ptr.get().raw() == other.ptr.get().raw()

    @property
    def nbytes(self):
        return self.ptr.get().bytes()

    @property
    def offset(self):
        """Byte offset inside the underlying wgpu buffer (0 unless a view)."""
        return self.ptr.get().offset()

    def upload(self, const unsigned char[::1] data not None, uint64_t offset=0):
        cdef uint64_t n = data.shape[0]
        if n == 0:
            return
        with nogil:
            self.ptr.get().upload(&data[0], n, offset)

    def download(self, unsigned char[::1] out not None, uint64_t offset=0):
        cdef uint64_t n = out.shape[0]
        if n == 0:
            return
        with nogil:
            self.ptr.get().download(&out[0], n, offset)


HOST_POOL_MIN_BYTES = c.host_pool_min_bytes


cdef class _HostBlock:
    """Host memory from the process's download pool (csrc/host_pool.hpp),
    exported through the buffer protocol as `nbytes` writable bytes: NumPy
    arrays made over it keep it alive, and it goes back to the pool when
    the last of them (and this object) is gone."""
    cdef shared_ptr[c.HostPool] pool
    cdef c.HostBlock block
    cdef Py_ssize_t nbytes
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, uint64_t nbytes):
        self.pool = c.HostPool.glob()
        with nogil:
            self.block = self.pool.get().take(nbytes)
        self.nbytes = nbytes

    def __dealloc__(self):
        if self.block.data != NULL:
            self.pool.get().give(self.block)

    def __getbuffer__(self, Py_buffer* view, int flags):
        self.shape[0] = self.nbytes
        self.strides[0] = 1
        view.buf = self.block.data
        view.obj = self
        view.len = self.nbytes
        view.readonly = 0
        view.itemsize = 1
        view.format = b"B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer* view):
        pass

    @property
    def mapped_bytes(self):
        """The block's size class (what it holds in the pool's accounting)."""
        return self.block.bytes


def host_pool_stats():
    cdef c.HostPoolStats s = c.HostPool.glob().get().stats()
    return {"in_use_bytes": s.in_use, "cached_bytes": s.cached, "limit_bytes": s.limit,
            "hits": s.hits, "misses": s.misses}


def empty_host_pool():
    cdef uint64_t freed
    cdef shared_ptr[c.HostPool] pool = c.HostPool.glob()
    with nogil:
        freed = pool.get().release()
    return freed


def host_size_class(uint64_t nbytes):
    return c.HostPool.size_class(nbytes)


cdef class _Storage:
    """The memory behind a tensor and every view of it, with PyTorch's version
    counter: each in-place write bumps ``version``, and autograd refuses a
    backward that would read a saved tensor written since it was saved."""
    cdef public _Buffer buf
    cdef public object version
    cdef public object half_shadow  # tensor.HalfShadow: a float16 copy its writer keeps, or None
    cdef object __weakref__  # the shadow refers back weakly: no reference cycle keeps memory alive

    def __cinit__(self, _Buffer buf not None):
        self.buf = buf
        self.version = 0
        self.half_shadow = None

    @property
    def nbytes(self):
        return self.buf.ptr.get().bytes()


cdef class _TensorFields:
    """The fields of ``pywgtrain.Tensor`` (its base class), kept in C: every op
    creates tensors, and filling sixteen Python slots costs about what
    recording the op's kernel does. The methods live in tensor.py."""
    cdef public object _store, _offset, _strides, _whole, _base, shape, dtype, device, _numel
    cdef public object requires_grad, grad, _node, _grad_home, _batch, _retains_grad, _view_of
    cdef object __weakref__


def _new_tensor(type cls not None, _Buffer buf not None, tuple shape not None, object dtype, object device,
                object numel, object batch):
    """A ``cls`` (Tensor) over all of ``buf``: contiguous, no autograd record.
    The caller has checked the arguments (ops derive them from checked inputs)."""
    return _make_tensor(cls, buf, shape, dtype, device, numel, batch)


cdef _TensorFields _make_tensor(type cls, _Buffer buf, tuple shape, object dtype, object device, object numel,
                                object batch):
    cdef _TensorFields t = cls.__new__(cls)
    t._store = _Storage(buf)
    t._offset = 0
    t._strides = None
    t._whole = True
    t._base = None
    t.shape = shape
    t.dtype = dtype
    t.device = device
    t._numel = numel
    t.requires_grad = False
    t.grad = None
    t._node = None
    t._grad_home = None
    t._batch = batch
    t._retains_grad = False
    t._view_of = None
    return t


cdef class _Recorder:
    """Records dispatches into one command encoder; submit() sends them in one submit."""
    cdef unique_ptr[Recorder] ptr
    cdef readonly _Device device

    def __cinit__(self, _Device device not None):
        self.device = device
        self.ptr.reset(new Recorder(device.ptr))

    @property
    def pending(self):
        return self.ptr.get().pending()

    def submit(self):
        cdef uint64_t index
        with nogil:
            index = self.ptr.get().submit()
        return index

    def begin_capture(self):
        self.ptr.get().begin_capture()

    def end_capture(self):
        cdef _StepGraph g = _StepGraph.__new__(_StepGraph)
        g.ptr = move(self.ptr.get().end_capture())
        return g

    @property
    def captured(self):
        """Dispatches captured so far."""
        return self.ptr.get().captured()

    @property
    def capturing(self):
        return self.ptr.get().capturing()

    def replay(self, _StepGraph graph not None, _PassTimer timer=None, inputs=()):
        """Re-record the graph's dispatches; with `timer`, each in its own timed pass.

        inputs: (captured _Buffer, source) pairs; bindings of the captured
        buffer read `source` instead for this replay: a _Buffer of the same
        size, or a C-contiguous NumPy array staged for this recording."""
        cdef vector[Rebind] rebinds
        cdef Rebind rb
        cdef _Buffer static, src
        cdef const uint8_t[::1] host
        cdef PassTimer* t = NULL
        for static, source in inputs:
            if static is None:  # a typed local takes None; dereferencing it would crash
                raise TypeError("replay: the captured buffer of an inputs pair is None")
            rb.src = whole(static.ptr.get()[0])
            if isinstance(source, _Buffer):
                src = source
                if src.ptr.get().bytes() != static.ptr.get().bytes():
                    raise ValueError(f"replay input of {src.ptr.get().bytes()} bytes for a captured buffer of "
                                     f"{static.ptr.get().bytes()} bytes")
                rb.to = whole(src.ptr.get()[0])
            else:
                host = memoryview(source).cast("B")
                if <uint64_t>host.shape[0] != static.ptr.get().bytes():
                    raise ValueError(f"replay input of {host.shape[0]} bytes for a captured buffer of "
                                     f"{static.ptr.get().bytes()} bytes")
                rb.to = self.ptr.get().stage(&host[0], host.shape[0])
            rebinds.push_back(rb)
        if timer is not None:
            t = timer.ptr.get()
        self.ptr.get().replay(graph.ptr.get()[0], rebinds, t)

    def copy(self, _Buffer src not None, uint64_t src_offset, _Buffer dst not None, uint64_t dst_offset,
             uint64_t nbytes):
        self.ptr.get().copy(src.ptr.get()[0], src_offset, dst.ptr.get()[0], dst_offset, nbytes)

    def write(self, _Buffer dst not None, uint64_t offset, data):
        """Write the bytes of `data` (C-contiguous) into dst at offset, in recording order."""
        cdef const uint8_t[::1] host = memoryview(data).cast("B")
        self.ptr.get().write(dst.ptr.get()[0], offset, &host[0], host.shape[0])

    def fill_zero(self, _Buffer dst not None, uint64_t offset, uint64_t nbytes):
        self.ptr.get().fill_zero(dst.ptr.get()[0], offset, nbytes)


cdef AdamWConfig _adamw_config(float lr, float beta1, float beta2, float eps, float weight_decay, float l2):
    cdef AdamWConfig cfg
    cfg.lr = lr
    cfg.beta1 = beta1
    cfg.beta2 = beta2
    cfg.eps = eps
    cfg.weight_decay = weight_decay
    cfg.l2 = l2
    return cfg


cdef class _StepGraph:
    """A captured dispatch sequence (see csrc/recorder.hpp StepGraph)."""
    cdef unique_ptr[StepGraph] ptr

    def __len__(self):
        return self.ptr.get().size()

    def kernel_names(self):
        return [n.decode() for n in self.ptr.get().kernel_names()]


cdef class _PassTimer:
    cdef unique_ptr[PassTimer] ptr

    def __cinit__(self, _Device device not None, uint32_t max_passes):
        self.ptr.reset(new PassTimer(device.ptr, max_passes))

    def time_next_pass(self, _Recorder r not None, uint32_t index):
        self.ptr.get().time_next_pass(r.ptr.get()[0], index)

    def read(self, _Recorder r not None, uint32_t passes):
        cdef vector[double] ns
        with nogil:
            ns = self.ptr.get().read(r.ptr.get()[0], passes)
        return list(ns)


cdef inline Buffer* _b(_Buffer b):
    return b.ptr.get()


cdef inline const Buffer* _opt(_Buffer b):
    if b is None:
        return <const Buffer*>NULL
    return b.ptr.get()


def gemm(_Recorder r not None, _Buffer a not None, _Buffer b not None, _Buffer out not None, uint32_t m, uint32_t n,
         uint32_t k, bint trans_a, bint trans_b, float alpha, float beta, bint half=False):
    """half: a, b and out hold float16 (accumulation in float32)."""
    if half:
        c.gemm_half(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(out)[0], m, n, k, trans_a, trans_b, alpha, beta)
    else:
        c.gemm(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(out)[0], m, n, k, trans_a, trans_b, alpha, beta)


def gemm_batched(_Recorder r not None, _Buffer a not None, _Buffer b not None, _Buffer out not None, uint32_t batch,
                 uint32_t m, uint32_t n, uint32_t k, bint trans_a, bint trans_b, float alpha, float beta):
    c.gemm_batched(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(out)[0], batch, m, n, k, trans_a, trans_b, alpha, beta)


def cross_entropy_forward(_Recorder r not None, _Buffer logits not None, _Buffer labels not None,
                          _Buffer row_stats not None, _Buffer row_loss not None, _Buffer row_valid not None,
                          _Buffer out not None, _Buffer scale not None, uint32_t rows, uint32_t cols,
                          int32_t ignore_index, bint mean, bint half=False):
    """row_stats: 2 floats a row, its max m and log(sum(exp(x - m))), for the
    backward. half: float16 logits (the loss and row buffers stay float32)."""
    c.cross_entropy_forward(r.ptr.get()[0], _b(logits)[0], _b(labels)[0], _b(row_stats)[0], _b(row_loss)[0],
                            _b(row_valid)[0], _b(out)[0], _b(scale)[0], rows, cols, ignore_index, mean, half)


def cross_entropy_backward(_Recorder r not None, _Buffer logits not None, _Buffer labels not None,
                           _Buffer row_stats not None, _Buffer upstream not None, _Buffer scale not None,
                           _Buffer dlogits not None, uint32_t rows, uint32_t cols, int32_t ignore_index, bint per_row,
                           float beta, bint half=False):
    """half: float16 logits and dlogits."""
    c.cross_entropy_backward(r.ptr.get()[0], _b(logits)[0], _b(labels)[0], _b(row_stats)[0], _b(upstream)[0],
                             _b(scale)[0], _b(dlogits)[0], rows, cols, ignore_index, per_row, beta, half)


def gemm_bias_act(_Recorder r not None, _Buffer a not None, _Buffer b not None, _Buffer bias not None,
                  _Buffer y not None, _Buffer preact, uint32_t m, uint32_t n, uint32_t k, bint trans_a, bint trans_b,
                  uint32_t act, bint half=False):
    """half: every operand float16 (ops.hpp)."""
    c.gemm_bias_act(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(bias)[0], _b(y)[0], _opt(preact), m, n, k,
                    trans_a, trans_b, <Activation>act, half)


def gemm_bias_residual(_Recorder r not None, _Buffer a not None, _Buffer b not None, _Buffer bias not None,
                       _Buffer residual not None, _Buffer y not None, uint32_t m, uint32_t n, uint32_t k,
                       bint trans_a, bint trans_b, bint half=False, bint half_out=False):
    """half: a, b and bias float16; half_out: residual and y float16 too."""
    c.gemm_bias_residual(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(bias)[0], _b(residual)[0], _b(y)[0], m, n, k,
                         trans_a, trans_b, half, half_out)


def linear_weight_grads(_Recorder r not None, _Buffer dz not None, _Buffer x not None, _Buffer dw not None,
                        _Buffer db not None, uint32_t rows, uint32_t out_features, uint32_t in_features, float beta):
    c.linear_weight_grads(r.ptr.get()[0], _b(dz)[0], _b(x)[0], _b(dw)[0], _b(db)[0], rows, out_features,
                          in_features, beta)


def gemm_act_grad(_Recorder r not None, _Buffer a not None, _Buffer b not None, _Buffer preact not None,
                  _Buffer out not None, uint32_t m, uint32_t n, uint32_t k, bint trans_a, bint trans_b, uint32_t act,
                  bint half=False):
    c.gemm_act_grad(r.ptr.get()[0], _b(a)[0], _b(b)[0], _b(preact)[0], _b(out)[0], m, n, k, trans_a, trans_b,
                    <Activation>act, half)


def activation_backward(_Recorder r not None, _Buffer dy not None, _Buffer z not None, _Buffer dz not None,
                        uint64_t n, uint32_t act, bint half=False):
    c.activation_backward(r.ptr.get()[0], _b(dy)[0], _b(z)[0], _b(dz)[0], n, <Activation>act, half)


def bias_grad(_Recorder r not None, _Buffer dz not None, _Buffer db not None, uint32_t rows, uint32_t cols, float beta,
              bint half=False):
    c.bias_grad(r.ptr.get()[0], _b(dz)[0], _b(db)[0], rows, cols, beta, half)


def adamw(_Recorder r not None, _Buffer param not None, _Buffer grad not None, _Buffer exp_avg not None,
          _Buffer exp_avg_sq not None, uint64_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
          uint64_t step, _Buffer clip=None, _Buffer param_half=None, float l2=0.0):
    """One AdamW step; ``param_half``: also write each new parameter's float16 copy there; ``l2``:
    Adam's weight decay (added to the gradient; pass weight_decay 0)."""
    cdef AdamWConfig cfg = _adamw_config(lr, beta1, beta2, eps, weight_decay, l2)
    c.adamw(r.ptr.get()[0], _b(param)[0], _b(grad)[0], _b(exp_avg)[0], _b(exp_avg_sq)[0], n, cfg, step, _opt(clip),
            _opt(param_half))


def grad_norm(_Recorder r not None, list grads not None, list counts not None, _Buffer scratch not None,
              _Buffer out not None, float max_norm):
    cdef vector[const Buffer*] gs
    cdef vector[uint64_t] ns = counts
    cdef _Buffer g
    for i, g in enumerate(grads):
        if g is None:  # a typed local takes None; dereferencing it would crash
            raise TypeError(f"grad_norm: grads[{i}] is None")
        gs.push_back(g.ptr.get())
    c.grad_norm(r.ptr.get()[0], gs, ns, _b(scratch)[0], _b(out)[0], max_norm)


def scale_by_clip(_Recorder r not None, _Buffer grad not None, uint64_t n, _Buffer norm_out not None):
    c.scale_by_clip(r.ptr.get()[0], _b(grad)[0], n, _b(norm_out)[0])


ADAM_SLOT_WORDS = c.kAdamSlotWords


def adamw_prepare(_Recorder r not None, _Buffer state not None, uint32_t first_slot, uint32_t slots,
                  _Buffer found_inf not None, float beta1, float beta2, float eps, float weight_decay,
                  _Buffer hyper not None, uint32_t group):
    cdef AdamWConfig cfg = _adamw_config(0.0, beta1, beta2, eps, weight_decay, 0.0)
    c.adamw_prepare(r.ptr.get()[0], _b(state)[0], first_slot, slots, _b(found_inf)[0], cfg, _b(hyper)[0], group)


def adamw_device(_Recorder r not None, _Buffer param not None, _Buffer grad not None, _Buffer exp_avg not None,
                 _Buffer exp_avg_sq not None, uint64_t n, float beta1, float beta2, float eps, float weight_decay,
                 _Buffer state not None, uint32_t slot, _Buffer found_inf not None, _Buffer clip=None,
                 _Buffer param_half=None, float l2=0.0):
    cdef AdamWConfig cfg = _adamw_config(0.0, beta1, beta2, eps, weight_decay, l2)
    c.adamw_device(r.ptr.get()[0], _b(param)[0], _b(grad)[0], _b(exp_avg)[0], _b(exp_avg_sq)[0], n, cfg,
                   _b(state)[0], slot, _b(found_inf)[0], _opt(clip), _opt(param_half))


def scaler_unscale(_Recorder r not None, _Buffer grad not None, uint64_t n, _Buffer scaler not None,
                   _Buffer found_inf not None, bint first):
    c.scaler_unscale(r.ptr.get()[0], _b(grad)[0], n, _b(scaler)[0], _b(found_inf)[0], first)


def scaler_update(_Recorder r not None, _Buffer scaler not None, float growth_factor, float backoff_factor,
                  uint32_t growth_interval, new_scale=None):
    cdef float value = 0.0
    if new_scale is not None:
        value = new_scale
    c.scaler_update(r.ptr.get()[0], _b(scaler)[0], growth_factor, backoff_factor, growth_interval,
                    &value if new_scale is not None else NULL)


def _inject_invalid_binding(_Recorder r not None, _Buffer buf not None):
    """Test hook: records a dispatch whose binding overruns ``buf`` (a wgpu validation error)."""
    c.inject_invalid_binding(r.ptr.get()[0], _b(buf)[0])


def _inject_allocation_failures(str label not None, uint32_t after, uint32_t count):
    """Test hook: after ``after`` more buffer allocations labelled ``label``, the next ``count`` raise
    OutOfMemoryError (``count`` 0 clears). ``"<driver>"``: the caching allocator's requests to the
    driver, which it retries once after emptying its cache."""
    c.inject_allocation_failures(label.encode(), after, count)


def _inject_map_failure(int64_t after, bint lose_device=False):
    """Test hook: after ``after`` more staging-buffer maps of host transfers, the next one fails
    (GpuError), or destroys the device first (``lose_device``: DeviceLostError); ``after`` < 0 disarms."""
    c.inject_map_failure(after, lose_device)


def _inject_download_delay(uint32_t ms):
    """Test hook: the next download's wait for the GPU lasts ``ms`` milliseconds longer."""
    c.inject_download_delay(ms)


# Tensor kernels of the autograd (csrc/tensor_ops.hpp). Ops are the numbers of
# pywgtrain._opcodes; shapes and strides are lists of ints (strides in elements).
# ``half``: which operands hold float16, a mask of operand slots (tensor_ops.hpp HalfMask).

def unary(_Recorder r not None, uint32_t op, _Buffer x not None, _Buffer y not None, uint64_t n, float a, float b,
          float beta, uint32_t half=0):
    c.unary(r.ptr.get()[0], <c.UnaryOp>op, _b(x)[0], _b(y)[0], n, a, b, beta, half)


def unary_backward(_Recorder r not None, uint32_t op, _Buffer x not None, _Buffer y not None, _Buffer dy not None,
                   _Buffer dx not None, uint64_t n, float a, float b, float beta, uint32_t half=0):
    c.unary_backward(r.ptr.get()[0], <c.UnaryOp>op, _b(x)[0], _b(y)[0], _b(dy)[0], _b(dx)[0], n, a, b, beta, half)


def binary(_Recorder r not None, uint32_t op, _Buffer a not None, _Buffer b not None, _Buffer out not None,
           list shape not None, list a_strides not None, list b_strides not None, float beta, uint32_t half=0):
    cdef vector[uint32_t] sh = shape, sa = a_strides, sb = b_strides
    c.binary(r.ptr.get()[0], <c.BinaryOp>op, _b(a)[0], _b(b)[0], _b(out)[0], sh, sa, sb, beta, half)


def binary_backward(_Recorder r not None, uint32_t op, uint32_t which, _Buffer a not None, _Buffer b not None,
                    _Buffer dy not None, _Buffer g not None, list shape not None, list a_strides not None,
                    list b_strides not None, float beta, uint32_t half=0):
    cdef vector[uint32_t] sh = shape, sa = a_strides, sb = b_strides
    c.binary_backward(r.ptr.get()[0], <c.BinaryOp>op, which, _b(a)[0], _b(b)[0], _b(dy)[0], _b(g)[0], sh, sa, sb,
                      beta, half)


def where(_Recorder r not None, _Buffer cond not None, _Buffer a not None, _Buffer b not None, _Buffer out not None,
          list shape not None, list c_strides not None, list a_strides not None, list b_strides not None, float beta,
          uint32_t half=0):
    cdef vector[uint32_t] sh = shape, sc = c_strides, sa = a_strides, sb = b_strides
    c.where(r.ptr.get()[0], _b(cond)[0], _b(a)[0], _b(b)[0], _b(out)[0], sh, sc, sa, sb, beta, half)


def strided_copy(_Recorder r not None, _Buffer src not None, uint64_t src_off, list src_strides not None,
                 _Buffer dst not None, uint64_t dst_off, list dst_strides not None, list shape not None, float beta,
                 uint32_t half=0):
    cdef vector[uint32_t] ss = src_strides, ds = dst_strides, sh = shape
    c.strided_copy(r.ptr.get()[0], _b(src)[0], src_off, ss, _b(dst)[0], dst_off, ds, sh, beta, half)


def fill(_Recorder r not None, _Buffer out not None, uint64_t n, float value, bint half=False):
    c.fill(r.ptr.get()[0], _b(out)[0], n, value, half)


def reduce_axis(_Recorder r not None, uint32_t op, _Buffer x not None, _Buffer out not None, _Buffer argmax,
                uint32_t outer, uint32_t len, uint32_t inner, float scale, float beta, bint half=False):
    """half: x holds float16 (out stays float32)."""
    c.reduce_axis(r.ptr.get()[0], <c.ReduceOp>op, _b(x)[0], _b(out)[0], _opt(argmax), outer, len, inner, scale, beta,
                  half)


def max_backward(_Recorder r not None, _Buffer dy not None, _Buffer argmax not None, _Buffer dx not None,
                 uint32_t outer, uint32_t len, uint32_t inner, float beta):
    c.max_backward(r.ptr.get()[0], _b(dy)[0], _b(argmax)[0], _b(dx)[0], outer, len, inner, beta)


def softmax(_Recorder r not None, _Buffer x not None, _Buffer y not None, uint32_t rows, uint32_t cols, bint log,
            bint half=False):
    """half: x holds float16 (y stays float32)."""
    c.softmax(r.ptr.get()[0], _b(x)[0], _b(y)[0], rows, cols, log, half)


def softmax_backward(_Recorder r not None, _Buffer y not None, _Buffer dy not None, _Buffer dx not None,
                     uint32_t rows, uint32_t cols, bint log, float beta, bint half=False):
    """half: dx holds float16 (y and dy stay float32)."""
    c.softmax_backward(r.ptr.get()[0], _b(y)[0], _b(dy)[0], _b(dx)[0], rows, cols, log, beta, half)


def embedding(_Recorder r not None, _Buffer weight not None, _Buffer ids not None, _Buffer out not None,
              uint32_t n_ids, uint32_t vocab, uint32_t dim):
    c.embedding(r.ptr.get()[0], _b(weight)[0], _b(ids)[0], _b(out)[0], n_ids, vocab, dim)


def embedding_backward(_Recorder r not None, _Buffer dy not None, _Buffer ids not None, _Buffer dweight not None,
                       uint32_t n_ids, uint32_t vocab, uint32_t dim, float beta):
    c.embedding_backward(r.ptr.get()[0], _b(dy)[0], _b(ids)[0], _b(dweight)[0], n_ids, vocab, dim, beta)


def next_token(_Recorder r not None, _Buffer logits not None, _Buffer tok not None, _Buffer hist not None,
               _Buffer pos not None, uint32_t rows, uint32_t cols, uint32_t hist_cols):
    c.next_token(r.ptr.get()[0], _b(logits)[0], _b(tok)[0], _b(hist)[0], _b(pos)[0], rows, cols, hist_cols)


def nll_pick(_Recorder r not None, _Buffer x not None, _Buffer labels not None, _Buffer out not None,
             _Buffer mask not None, uint32_t rows, uint32_t cols, int32_t ignore_index):
    c.nll_pick(r.ptr.get()[0], _b(x)[0], _b(labels)[0], _b(out)[0], _b(mask)[0], rows, cols, ignore_index)


def nll_pick_backward(_Recorder r not None, _Buffer dy not None, _Buffer labels not None, _Buffer dx not None,
                      uint32_t rows, uint32_t cols, int32_t ignore_index, float beta):
    c.nll_pick_backward(r.ptr.get()[0], _b(dy)[0], _b(labels)[0], _b(dx)[0], rows, cols, ignore_index, beta)


# Fused causal self-attention (csrc/attention.cpp). A view is (off, sb, sh, st)
# in elements: element (b, h, t, d) of the operand at off + b*sb + h*sh + t*st + d.
# half: the operands and outputs hold float16 (lse and delta stay float32).

cdef c.AttnView _view(tuple view) except *:
    cdef c.AttnView v
    if len(view) != 4:
        raise ValueError(f"attention view must be (off, sb, sh, st), got {view!r}")
    v.off = view[0]
    v.sb = view[1]
    v.sh = view[2]
    v.st = view[3]
    return v


cdef c.AttnShape _attn_shape(uint32_t batch, uint32_t heads, uint32_t t, uint32_t d, object tk, bint causal):
    cdef c.AttnShape s
    s.batch = batch
    s.heads = heads
    s.t = t
    s.tk = t if tk is None else tk
    s.d = d
    s.causal = causal
    return s


# Queries [batch, heads, t, d]; keys and values [batch, heads, tk, d] (tk None: t).
def attention_forward(_Recorder r not None, _Buffer q not None, tuple qv not None, _Buffer k not None,
                      tuple kv not None, _Buffer v not None, tuple vv not None, _Buffer out not None, tuple ov not None,
                      _Buffer lse not None, uint32_t batch, uint32_t heads, uint32_t t, uint32_t d, float scale,
                      uint32_t max_blocks=0, bint half=False, tk=None, bint causal=True, _Buffer kbias=None):
    """kbias: float32 [batch][tk] added to the scaled scores of each key (a key padding mask)."""
    c.attention_forward(r.ptr.get()[0], _b(q)[0], _view(qv), _b(k)[0], _view(kv), _b(v)[0], _view(vv), _b(out)[0],
                        _view(ov), _b(lse)[0], _attn_shape(batch, heads, t, d, tk, causal), scale, max_blocks, half,
                        _opt(kbias))


def attention_backward(_Recorder r not None, _Buffer q not None, tuple qv not None, _Buffer k not None,
                       tuple kv not None, _Buffer v not None, tuple vv not None, _Buffer out not None,
                       tuple ov not None, _Buffer dout not None, tuple gv not None, _Buffer lse not None,
                       _Buffer delta not None, _Buffer dq not None, tuple dqv not None, _Buffer dk not None,
                       tuple dkv not None, _Buffer dv not None, tuple dvv not None, uint32_t batch, uint32_t heads,
                       uint32_t t, uint32_t d, float scale, float beta, uint32_t max_blocks=0, bint half=False,
                       tk=None, bint causal=True, _Buffer kbias=None):
    c.attention_backward(r.ptr.get()[0], _b(q)[0], _view(qv), _b(k)[0], _view(kv), _b(v)[0], _view(vv), _b(out)[0],
                         _view(ov), _b(dout)[0], _view(gv), _b(lse)[0], _b(delta)[0], _b(dq)[0], _view(dqv),
                         _b(dk)[0], _view(dkv), _b(dv)[0], _view(dvv), _attn_shape(batch, heads, t, d, tk, causal),
                         scale, beta, max_blocks, half, _opt(kbias))


def attention_decode(_Recorder r not None, _Buffer qkv not None, _Buffer k_cache not None, _Buffer v_cache not None,
                     _Buffer pos not None, _Buffer out not None, uint32_t batch, uint32_t heads, uint32_t capacity,
                     uint32_t d, float scale):
    c.attention_decode(r.ptr.get()[0], _b(qkv)[0], _b(k_cache)[0], _b(v_cache)[0], _b(pos)[0], _b(out)[0], batch,
                       heads, capacity, d, scale)
# Fused LayerNorm (csrc/layernorm.cpp); weight, bias, dx, dweight, dbias may be None; half: x and dx
# hold float16 (y, dy, weight, bias and their gradients stay float32).


def layer_norm_forward(_Recorder r not None, _Buffer x not None, _Buffer weight, _Buffer bias, _Buffer y not None,
                       _Buffer mean not None, _Buffer rstd not None, uint32_t rows, uint32_t cols, float eps,
                       bint half=False):
    c.layer_norm_forward(r.ptr.get()[0], _b(x)[0], _opt(weight), _opt(bias), _b(y)[0], _b(mean)[0], _b(rstd)[0],
                         rows, cols, eps, half)


def layer_norm_backward(_Recorder r not None, _Buffer x not None, _Buffer weight, _Buffer mean not None,
                        _Buffer rstd not None, _Buffer dy not None, _Buffer dx, _Buffer dweight, _Buffer dbias,
                        uint32_t rows, uint32_t cols, float beta, float beta_weight, float beta_bias,
                        bint half=False):
    c.layer_norm_backward(r.ptr.get()[0], _b(x)[0], _opt(weight), _b(mean)[0], _b(rstd)[0], _b(dy)[0], _opt(dx),
                          _opt(dweight), _opt(dbias), rows, cols, beta, beta_weight, beta_bias, half)


# Dropout (csrc/dropout.cpp): state and key are 16-byte buffers of 4 uint32.

def rng_take(_Recorder r not None, _Buffer state not None, _Buffer key not None):
    c.rng_take(r.ptr.get()[0], _b(state)[0], _b(key)[0])


def dropout(_Recorder r not None, _Buffer x not None, _Buffer key not None, _Buffer y not None, uint64_t n, double p,
            float beta, bint half=False):
    c.dropout(r.ptr.get()[0], _b(x)[0], _b(key)[0], _b(y)[0], n, p, beta, half)


def dropout_threshold(double p):
    """round(p * 2^32), capped at 2^32 - 1: random words below it drop their element."""
    return c.dropout_threshold(p)


# Casts (csrc/cast.cpp): n elements float32 -> float16 (to_half) or float16 -> float32.

def cast(_Recorder r not None, _Buffer src not None, _Buffer dst not None, uint64_t n, bint to_half):
    c.cast(r.ptr.get()[0], _b(src)[0], _b(dst)[0], n, to_half)


# ---- the host <-> shader contract (csrc/shader_contract.hpp), for tests/test_contract.py ----

def uniform_layouts():
    """{WGSL struct name: (size, [(field, WGSL type, offset, size), ...])} of every uniform block the host fills."""
    return {_s(u.name): (u.size, [(_s(f.name), _s(f.type), f.offset, f.size) for f in u.fields])
            for u in c.uniform_layouts()}


def shader_bindings():
    """{shader stem: [(binding, variable, access, WGSL type), ...]}: every binding the host knows of."""
    out = {}
    for b in c.contract_bindings():
        out.setdefault(_s(b.shader), []).append((b.binding, _s(b.var), _s(b.access), _s(b.type)))
    return out


def shader_constants():
    """{shader stem: {name: value}}: the u32 constants the pipeline cache emits ahead of each shader."""
    out = {}
    for k in c.contract_constants():
        out.setdefault(_s(k.shader), {})[_s(k.name)] = k.value
    return out


# ---- where one operation records (device.py's Device._recording()) and the
# common case of the element-wise ops, kept here because an op called on its
# own pays these per call ----

from threading import RLock as _RLock

cdef class BatchToken:
    """Marks the work a ``Device.batch()`` block recorded and has not yet
    submitted. Tensors created inside the block keep the token current at
    their creation (``Device._current_batch_token()``); when the block is
    discarded by an exception the token's ``discarded`` flag is set, and
    reading such a tensor raises instead of returning memory nothing wrote.
    A read inside the block submits what is recorded so far: the token is
    then retired (its work will run) and later tensors get a fresh one."""
    cdef public bint discarded
    cdef public object reason

    def __cinit__(self, reason=None):
        """``reason``: born discarded (work dropped outside a batch, e.g. a failed group of replayed steps)."""
        self.discarded = reason is not None
        self.reason = reason

    def check(self):
        """Raise RuntimeError if the batch this token belongs to was discarded."""
        if self.discarded:
            raise RuntimeError(self.reason)

    def __repr__(self):
        return f"<BatchToken {'discarded' if self.discarded else 'live'}>"


cdef _mark_lost(BatchToken token, str why):
    token.reason = f"the work that was to write this tensor never ran: {why}"
    token.discarded = True


cdef class _Stream:
    """Streaming submission: operations recorded outside a ``Device.batch()``,
    by any thread, go into one open recording per device, which is submitted
    once it holds ``chunk`` operations (or ``Device.BATCH_SUBMIT_COMMANDS``
    commands) and whenever the device is flushed (a host read or write,
    ``synchronize()``, ``query()``, a batch starting). After a flush the GPU
    is idle (the host waited), so ``chunk`` restarts at 1 and doubles with
    each submission up to ``Device.BATCH_SUBMIT_COMMANDS``: the GPU starts on
    the first operation while Python records the next ones, and a long stream
    still pays few submissions (a CUDA stream's behaviour). Operations, not
    commands: a submission costs the host 20-50 us, wgpu-native's finish of
    the recording most of it, so an operation of two dispatches (a split-K
    product) must not double the submissions of a stream.
    One per device, not per thread, so that a tensor handed to another
    thread is flushed by that thread's read; ``lock`` serializes
    recording into it. If a command fails to record, the core discards the
    whole recording: the tensors its work was to write then raise on read."""
    cdef readonly _Recorder rec
    cdef public BatchToken token  # tensors created while this recording is open
    cdef readonly object lock
    cdef readonly Py_ssize_t submits
    cdef readonly size_t chunk  # operations the next submission waits for
    cdef readonly size_t ops  # operations recorded since the last submission

    def __cinit__(self, _Device device not None):
        self.rec = _Recorder(device)
        self.token = BatchToken()
        self.lock = _RLock()
        self.submits = 0
        self.chunk = 1
        self.ops = 0

    def submit(self):
        """Submit what is recorded (a flush): the next operations start a new ramp of chunks."""
        self.lock.acquire()
        try:
            self.chunk = 1
            self._submit()
        finally:
            self.lock.release()

    cdef _submit(self):
        cdef BatchToken token
        cdef Recorder* rec = self.rec.ptr.get()
        self.lock.acquire()  # also when nothing is pending: another thread's submit may be under way
        try:
            if not rec.pending():
                return
            token, self.token = self.token, BatchToken()
            self.submits += 1
            self.ops = 0
            try:
                with nogil:
                    rec.submit()
            except BaseException as e:
                _mark_lost(token, f"submitting it failed: {type(e).__name__}: {e}")
                raise
        finally:
            self.lock.release()

    def lose(self, str why not None):
        """The open recording was discarded by the core (caller holds the lock)."""
        token, self.token = self.token, BatchToken()
        _mark_lost(token, f"a later operation failed to record ({why}), and the core discards its whole recording")


cdef class _Recording:
    """Device._recording()'s context manager: the thread's open batch
    recorder, else the device's stream under its lock (submitted once it
    holds the stream's ``chunk`` of commands). The fast paths below
    use its ``_enter``/``_exit`` without the ``with`` statement."""
    cdef object _dev  # the pywgtrain.Device
    cdef _Stream _stream
    cdef _Recorder _batch  # the thread's batch recorder while inside one
    cdef size_t _submits, _pending

    def __cinit__(self, dev):
        self._dev = dev

    def __enter__(self):
        return self._enter(getattr(self._dev._local, "recorder", None))

    def __exit__(self, exc_type, exc, tb):
        self._exit(exc)

    cdef _Recorder _enter(self, batch):
        """``batch``: the thread's batch recorder of this device, or None."""
        cdef _Stream stream
        if batch is not None:
            self._batch = batch
            return self._batch
        stream = self._dev._stream
        stream.lock.acquire()
        self._stream = stream
        self._submits, self._pending = stream.submits, stream.rec.ptr.get().pending()
        return stream.rec

    cdef _exit(self, exc):
        """``exc``: the exception leaving the block, or None."""
        cdef _Stream stream = self._stream
        cdef _Recorder batch = self._batch
        self._stream = None
        self._batch = None
        if stream is not None:
            try:
                if exc is not None:
                    if self._pending and stream.submits == self._submits and not stream.rec.ptr.get().pending():
                        # The core discards a recording whose command failed (Recorder::recording_step),
                        # earlier operations' work with it.
                        stream.lose(f"{type(exc).__name__}: {exc}")
                else:
                    stream.ops += 1
                    if (stream.ops >= stream.chunk and stream.rec.ptr.get().pending()) or (
                            stream.rec.ptr.get().pending() >= <size_t>self._dev.BATCH_SUBMIT_COMMANDS):
                        stream._submit()
                        stream.chunk = min(2 * stream.chunk, <size_t>self._dev.BATCH_SUBMIT_COMMANDS)
            finally:
                stream.lock.release()
            return
        # In a batch, an exception discards the whole block's unsubmitted work (Device.batch).
        if (exc is None and batch.ptr.get().pending() >= <size_t>self._dev.BATCH_SUBMIT_COMMANDS
                and not batch.ptr.get().capturing()):
            self._dev._submit_batch_part(batch)  # the GPU starts while the rest is recorded


# Set by pywgtrain.functions when it loads (register_fast_paths): the Tensor
# class, float32's dtype, the autograd record of a binary op, autocast's and
# autograd's per-thread states.
cdef object _Tensor = None
cdef object _F32 = None
cdef object _binary_grad = None
cdef object _autocast = None
cdef object _grad_mode = None


def register_fast_paths(type tensor not None, f32, binary_grad, autocast_state, grad_mode):
    """``grad_mode``: autograd's per-thread state (``enabled``, default True)."""
    global _Tensor, _F32, _binary_grad, _autocast, _grad_mode
    _Tensor, _F32, _binary_grad, _autocast, _grad_mode = tensor, f32, binary_grad, autocast_state, grad_mode


cdef _TensorFields _result_of(dev, batch, tuple shape, uint64_t numel):
    """A new float32 result of ``numel`` (> 0) elements, with the token of where it is recorded
    (``batch``: the thread's batch recorder or None; Device._current_batch_token())."""
    token = dev._stream.token if batch is None else getattr(dev._local, "batch_token", None)
    return _make_tensor(_Tensor, _Buffer(<_Device>dev._dev, numel * 4), shape, _F32, dev, numel, token)


cdef inline Buffer* _tbuf(_TensorFields t):
    return (<_Storage>t._store).buf.ptr.get()


cdef enum:
    _MAX_DIMS = 6  # tensor_ops.hpp kMaxDims


def binary_fast(uint32_t op, a, b):
    """``op`` (a BinaryOp) of two float32 tensors of one device that kernels
    bind as they are (``_whole``), nonempty, of equal or broadcastable shapes
    of at most six dimensions: checks, broadcast strides, the result, the
    recording; the autograd record through functions' hook. None for any
    other call: the ops' Python path (functions._binary) handles it, with its
    errors."""
    cdef _TensorFields ta, tb, out
    cdef _Recording r
    cdef _Recorder rec
    cdef Py_ssize_t na, nb, n, i
    cdef uint32_t ea, eb
    cdef uint64_t numel = 1, sta = 1, stb = 1
    cdef vector[uint32_t] sh, sa, sb
    if _Tensor is None or not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        return None
    ta, tb = <_TensorFields>a, <_TensorFields>b
    if ta.dtype is not _F32 or tb.dtype is not _F32 or ta.device is not tb.device:
        return None
    if not ta._whole or not tb._whole:
        return None
    shape_a, shape_b = <tuple>ta.shape, <tuple>tb.shape
    na, nb = len(shape_a), len(shape_b)
    n = na if na > nb else nb
    if n > _MAX_DIMS:
        return None
    if n == 0:  # two 0-d tensors: the kernels take one dimension
        sh.push_back(1)
        sa.push_back(1)
        sb.push_back(1)
    else:
        sh.resize(n)
        sa.resize(n)
        sb.resize(n)
        for i in range(n - 1, -1, -1):  # right-aligned, strides of each operand's own (padded) layout
            ea = <uint32_t>shape_a[i - n + na] if i >= n - na else 1
            eb = <uint32_t>shape_b[i - n + nb] if i >= n - nb else 1
            if ea == 0 or eb == 0 or (ea != eb and ea != 1 and eb != 1):
                return None  # empty, or not broadcastable: the Python path decides
            sh[i] = ea if ea > eb else eb
            sa[i] = 0 if ea == 1 and sh[i] != 1 else <uint32_t>sta
            sb[i] = 0 if eb == 1 and sh[i] != 1 else <uint32_t>stb
            sta *= ea
            stb *= eb
            numel *= sh[i]
    shape = shape_a if shape_a == shape_b else tuple([sh[i] for i in range(n)])
    dev = ta.device
    batch = getattr(dev._local, "recorder", None)
    out = _result_of(dev, batch, shape, numel)
    r = _Recording(dev)
    rec = r._enter(batch)
    try:
        c.binary(rec.ptr.get()[0], <c.BinaryOp>op, _tbuf(ta)[0], _tbuf(tb)[0], _tbuf(out)[0], sh, sa, sb, 0.0, 0)
    except BaseException as e:
        r._exit(e)
        raise
    r._exit(None)
    if ta.requires_grad or tb.requires_grad:
        return _binary_grad(op, a, b, out, list(sh), list(sa), list(sb))
    return out


cdef enum:
    _GEMM_PLAIN = 0  # pw.gemm(a, b, trans_a, trans_b): the result's version bumped, as ops.gemm's
    _GEMM_MATMUL = 1  # a @ b of 2-D tensors
    _GEMM_LINEAR = 2  # F.linear(a, b, bias): a is [..., k], b the [n, k] weight

GEMM_PLAIN, GEMM_MATMUL, GEMM_LINEAR = _GEMM_PLAIN, _GEMM_MATMUL, _GEMM_LINEAR


def gemm_fast(uint32_t kind, a, b, bias, bint trans_a, bint trans_b):
    """The plain case of a matrix product ``kind`` (GEMM_*): float32 tensors
    of one device that kernels bind as they are, nonempty, matching inner
    dimensions, a bias of shape (n,); for matmul and linear also no operand
    requiring grad and autocast off. Checks, the result, the recording; None
    for any other call, which the op's Python path handles, with its errors."""
    cdef _TensorFields ta, tb, tbias = None, out
    cdef _Recording r
    cdef _Recorder rec
    cdef uint64_t m, n, k, rows
    if _Tensor is None or not isinstance(a, _Tensor) or not isinstance(b, _Tensor):
        return None
    ta, tb = <_TensorFields>a, <_TensorFields>b
    if bias is not None:
        if not isinstance(bias, _Tensor):
            return None
        tbias = <_TensorFields>bias
        if tbias.dtype is not _F32 or tbias.device is not ta.device or not tbias._whole:
            return None
    if ta.dtype is not _F32 or tb.dtype is not _F32 or ta.device is not tb.device or not ta._whole or not tb._whole:
        return None
    if kind != _GEMM_PLAIN and (_autocast.dtype is not None or (
            (ta.requires_grad or tb.requires_grad or (tbias is not None and tbias.requires_grad))
            and getattr(_grad_mode, "enabled", True))):
        return None  # autocast's casts, or an autograd record: the Python path
    shape_a, shape_b = <tuple>ta.shape, <tuple>tb.shape
    if len(shape_b) != 2 or not (len(shape_a) == 2 or (kind == _GEMM_LINEAR and len(shape_a) >= 1)):
        return None
    if kind == _GEMM_LINEAR:
        k = shape_a[len(shape_a) - 1]
        m = <uint64_t>ta._numel // k if k else 0
        trans_a = False
    else:
        m, k = (shape_a[1], shape_a[0]) if trans_a else (shape_a[0], shape_a[1])
    n, rows = (shape_b[0], shape_b[1]) if trans_b else (shape_b[1], shape_b[0])
    if rows != k or m == 0 or n == 0 or k == 0 or m > 0xFFFFFFFF or n > 0xFFFFFFFF or k > 0xFFFFFFFF:
        return None
    if tbias is not None and tbias.shape != (n,):
        return None
    shape = shape_a[:len(shape_a) - 1] + (n,) if kind == _GEMM_LINEAR else (m, n)
    dev = ta.device
    batch = getattr(dev._local, "recorder", None)
    out = _result_of(dev, batch, shape, m * n)
    r = _Recording(dev)
    rec = r._enter(batch)
    try:
        if tbias is not None:
            c.gemm_bias_act(rec.ptr.get()[0], _tbuf(ta)[0], _tbuf(tb)[0], _tbuf(tbias)[0], _tbuf(out)[0], NULL,
                            m, n, k, trans_a, trans_b, <Activation>0, False)
        else:
            c.gemm(rec.ptr.get()[0], _tbuf(ta)[0], _tbuf(tb)[0], _tbuf(out)[0], m, n, k, trans_a, trans_b, 1.0, 0.0)
    except BaseException as e:
        r._exit(e)
        raise
    r._exit(None)
    if kind == _GEMM_PLAIN:
        (<_Storage>out._store).version += 1
    return out
