"""DistributedOptimizer: average gradients over ranks while backward runs, then step the wrapped optimizer.

How it works. Each parameter gets a post-accumulate-grad hook. When backward has produced a parameter's
gradient for the k-th time (k = ``backward_passes_per_step``), the hook starts an in-place asynchronous
allreduce of ``p.grad``, so communication overlaps the rest of backward. ``step()`` first calls
``synchronize()``, which waits for all of them, then steps the wrapped optimizer.

Every rank submits exactly one allreduce per communication unit (a parameter, or a group of parameters
with ``groups=``) per step, under the same name: units whose gradient backward did not produce on this
rank (unused branches, frozen-by-control-flow layers) are sent as zeros from ``synchronize()``, so ranks
never wait for each other's missing tensors.

Wrapping instead of subclassing. Horovod builds a new class with ``type(...)`` that inherits from the
wrapped optimizer's class. This module wraps instead: :class:`DistributedOptimizer` is a
``torch.optim.Optimizer`` (``isinstance`` holds, LR schedulers accept it) whose ``param_groups``,
``state`` and ``defaults`` *are* the wrapped optimizer's, and which delegates ``state_dict``,
``load_state_dict``, ``add_param_group`` and any other attribute to it. ``isinstance(opt, torch.optim.SGD)``
is therefore False; use ``opt.optimizer`` for the wrapped object.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
import weakref
from collections import Counter

import torch

import commlib as _cl

from .. import validation
from . import collectives as C
from ..frameworks import split_evenly
from .collectives import Adasum, Average, Compression, Sum, resolve_op, set_kwargs, set_size
from .bridge import NUMPY_DTYPES


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` so that ``step()`` applies gradients averaged (``op``) over all ranks.

    Arguments:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()``; names the allreduces (they must match across
            ranks). Every parameter of ``optimizer`` must be named, names must be unique. Default: names
            from the position in ``param_groups``.
        compression: ``Compression.none``, ``.fp16`` or ``.bf16`` (half precision on the wire only).
        backward_passes_per_step: backward passes accumulated locally before gradients are communicated.
        op: ``Average`` (default) or ``Sum`` (or Min/Max/Product, or ``Adasum``: the gradients are combined
            with Adasum, see :mod:`commlib.adasum`; Horovod's Adasum optimizer combines parameter deltas
            after a local step instead, which this does not do).
        gradient_predivide_factor: with ``Average``, gradients are scaled by ``1/f`` before the sum and by
            ``f/size`` after it (helps against float16 overflow in the sum).
        groups: ``None``; an int n: parameters are split into n groups, each reduced as one grouped
            allreduce once all its gradients are ready; or a list of lists of parameters (the rest are
            reduced alone).
        process_set: reduce among the ranks of this registered process set only (default: all ranks);
            a rank outside it steps with its own gradients, as in Horovod.
        sparse_as_dense: sparse gradients (``nn.Embedding(sparse=True)``) are densified for the
            allreduce and made sparse again; without it they are reduced as Horovod does, by an
            allgather of every rank's indices and values.
        priority: ``None`` (default): gradients are reduced in the order they become ready.
            ``"forward"``: each gradient's priority is its layer's place in the forward pass (the first
            layer highest): among gradients ready at once the coordinator sends the one the next forward
            pass needs first, large ones in partitions so that a small urgent one goes between them
            (ByteScheduler's scheduling; docs/torch.md, "Priority scheduling"). The order is the
            parameters' registration order (``named_parameters``) until ``model``'s first forward pass
            has run, then the order its modules ran in on rank 0, broadcast at the next synchronize.
        model: the ``torch.nn.Module`` whose parameters these are: its forward pass is recorded for
            ``priority="forward"``, and ``overlap_forward`` waits in its modules' forward pre-hooks.
        overlap_forward: ``step()`` returns at once; each module's forward pre-hook waits for its own
            parameters' gradients (and those of every layer before it), and steps the wrapped optimizer
            for those parameters only, so the next forward pass starts while the last gradients are still
            on the wire. Needs ``model``; the weights are those of the blocking step (the optimizer runs
            per parameter with the hyperparameters of the ``step()`` call). Call ``synchronize()`` before
            reading the parameters outside a forward pass (evaluation without a forward, saving).
            An optimizer whose step couples parameters (a global gradient norm) needs the blocking step.

    Example::

        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size()),
                                       named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for x, y in batches:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()

    For gradient clipping, synchronize first and skip the synchronization in ``step``::

        loss.backward()
        opt.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            opt.step()
    """

    # torch.optim.Optimizer.__init__ is deliberately not called: param_groups, state and defaults belong
    # to the wrapped optimizer and are exposed through the properties below.
    def __init__(self, optimizer, named_parameters=None, compression=Compression.none,
                 backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set=None, priority=None, model=None, overlap_forward=False):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("this optimizer is already a DistributedOptimizer; wrap the plain optimizer once")
        self._optimizer = optimizer
        op = resolve_op(op)
        gradient_predivide_factor = validation.check_scale_factor(
            gradient_predivide_factor, "gradient_predivide_factor", "DistributedOptimizer")
        if gradient_predivide_factor <= 0:
            raise ValueError(f"DistributedOptimizer: gradient_predivide_factor must be positive, got "
                             f"{gradient_predivide_factor}")
        if gradient_predivide_factor != 1.0 and op is not Average:
            raise ValueError(f"gradient_predivide_factor={gradient_predivide_factor} needs op=Average "
                             f"(got op={op.name}); it splits the averaging before and after the sum")
        if int(backward_passes_per_step) != backward_passes_per_step or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
        check_momentum(optimizer, compression)
        self.op = op
        self.compression = compression
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.sparse_as_dense = bool(sparse_as_dense)
        self.process_set = process_set
        # A plain reduction (no Horovod-style compressor, no Adasum, no compression): one-parameter units
        # with dense CPU gradients take _start_plain.
        self._plain = compression is Compression.none and op is not Adasum
        # Average divides part before the sum and the rest after it (commlib's Average divides by size after)
        self._scales = ((1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor) if op is Average
                        else (1.0, 1.0))

        self._named = _named_parameters(optimizer, named_parameters)
        self._names = {}           # parameter -> allreduce name
        self._units = []           # tuples of parameters reduced together
        self._unit_of = {}         # parameter -> its unit
        self._unit_by_id = {}      # id(parameter) -> its unit (the gradient hook's lookup)
        self._delay = {}           # id(parameter) -> backward passes left before it is communicated
        self._ready = Counter()    # unit (of several parameters) -> members whose gradient is final
        self._handles = {}         # unit -> function waiting for its reduction
        self._seen = set()         # id()s of the parameters whose gradient arrived since the last synchronize
        self._requests = {}        # unit of one parameter -> (priority, commlib.PersistentAllreduce)
        self._hooks = []
        self._priority = {}        # unit -> its priority (priority="forward"), else empty
        self._pending = []         # overlap_forward: (unit, wait) of the last step, most urgent first
        self._applied = 0          # ... how many of them are applied
        self._step_groups = None   # ... the hyperparameters of that step (param_groups without params)
        self._zero_pending = None  # ... zero_grad(set_to_none) asked for while their update was pending
        self._pending_unit = {}    # ... unit -> its index in _pending
        self._synchronized = False
        self._should_synchronize = True
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        for p in params:
            self._names[p] = self._named[p]
        # As Horovod: a rank outside the process set registers no hooks and steps with its own gradients.
        self._included = process_set is None or bool(process_set.included())
        units = _form_units(params, self._names, groups, process_set) if self._included else []
        # The hooks hold this object weakly and are removed when it is collected, so wrapping the same
        # parameters again later (a new optimizer after a checkpoint load) leaves no stale hooks behind.
        weakref.finalize(self, _remove_hooks, self._hooks)
        for unit in units:
            self._add_unit(unit)
        self._setup_priority(priority, model, overlap_forward)

    # --- delegation to the wrapped optimizer ----------------------------------------------------------------

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The wrapped optimizer."""
        return self._optimizer

    @property
    def param_groups(self):
        return self._optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self._optimizer.param_groups = value

    @property
    def state(self):
        return self._optimizer.state

    @state.setter
    def state(self, value):
        self._optimizer.state = value

    @property
    def defaults(self):
        return self._optimizer.defaults

    @defaults.setter
    def defaults(self, value):
        self._optimizer.defaults = value

    def __getattr__(self, name):
        # Only reached for attributes the wrapper does not have: hyperparameters, hook registries, ...
        if name.startswith("__") or name == "_optimizer":
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __getstate__(self):
        raise TypeError("a DistributedOptimizer cannot be pickled (it holds autograd hooks); "
                        "save optimizer.state_dict() instead")

    def __repr__(self):
        return f"DistributedOptimizer({self._optimizer!r})"

    @property
    def _parameter_names(self):
        """parameter -> the name its gradient is reduced under (Horovod's attribute of the same name)."""
        return self._names

    def state_dict(self):
        self._apply_pending()
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict):
        """Load the wrapped optimizer's state; gradients in flight are dropped (call it between steps)."""
        self._apply_pending()
        self._reset()
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group):
        """Add a parameter group to the wrapped optimizer; its parameters are reduced one by one, named
        from ``named_parameters`` when given there, else by position (the same on every rank)."""
        self._optimizer.add_param_group(param_group)
        index = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[-1]["params"]):
            if p.requires_grad and p not in self._unit_of and self._included:
                self._names[p] = self._named.get(p, f"allreduce.noname.{index}.{j}")
                self._add_unit((p,))

    # --- priority scheduling and overlap_forward -----------------------------------------------------------

    def _setup_priority(self, priority, model, overlap_forward):
        if priority not in (None, "forward"):
            raise ValueError(f"DistributedOptimizer: priority must be None or 'forward', got {priority!r}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"DistributedOptimizer: model must be a torch.nn.Module, not {type(model).__name__}")
        if overlap_forward and model is None:
            raise ValueError("DistributedOptimizer: overlap_forward=True needs model=, the module whose forward "
                             "pre-hooks wait for the parameters' updates")
        self.priority = priority
        self.overlap_forward = bool(overlap_forward)
        self._recorded = None      # priority="forward" with a model: modules in the order their forward ran
        self._module_units = {}    # overlap_forward: module -> the units of its own parameters
        if not self._included:
            return
        if priority == "forward":
            self._set_order(list(self._named))  # registration order until a forward pass is recorded
        if model is None:
            return
        modules = list(model.modules())
        if priority == "forward":
            self._recorded = {}
        if self.overlap_forward:
            for module in modules:
                units = list(dict.fromkeys(self._unit_of[p] for p in module.parameters(recurse=False)
                                           if p in self._unit_of))
                if units:
                    self._module_units[module] = units
            for p in self._unit_of:
                self._hooks.append(p.register_hook(_weak_grad_check(self, p)))
        if self._recorded is not None or self._module_units:
            for module in modules:
                self._hooks.append(module.register_forward_pre_hook(_weak_pre_hook(self, module)))

    def _set_order(self, params):
        """Priorities from a forward order of parameters (first highest); units take their first member's."""
        position = {}
        for p in params:
            if p in self._unit_of and p not in position:
                position[p] = len(position)
        last = len(position)
        for unit in self._units:
            first = min(position.get(p, last) for p in unit)
            self._priority[unit] = last + 1 - first  # >= 1: every gradient asks for scheduling

    def _agree_order(self):
        """Once, after the first step: rank 0's recorded forward order (parameter names) for every rank."""
        recorded, self._recorded = self._recorded, None
        own = [self._names[p] for module in recorded for p in module.parameters(recurse=False)
               if p in self._names]
        root = 0 if self.process_set is None else self.process_set.ranks[0]
        names = _cl.broadcast_object(own, root_rank=root, name="DistributedOptimizer.forward_order",
                                     **set_kwargs(self.process_set))
        by_name = {name: p for p, name in self._names.items()}
        order = [by_name[n] for n in names if n in by_name] + list(self._named)
        self._set_order(order)

    def _before_forward(self, module):
        recorded = self._recorded
        if recorded is not None and module not in recorded:
            recorded[module] = None
        if self._applied < len(self._pending):
            units = self._module_units.get(module)
            if units:
                index = self._pending_unit
                target = max(index.get(u, -1) for u in units)
                if target >= self._applied:
                    self._apply_until(target + 1)

    def _check_fresh(self, p):
        """overlap_forward: a gradient computed for a parameter whose last update is still pending means the
        forward pass read the parameter before it was updated: an error, not stale weights."""
        index = self._pending_unit.get(self._unit_of[p])
        if index is not None and index >= self._applied:
            raise RuntimeError(
                f"DistributedOptimizer(overlap_forward=True): the gradient of {self._names[p]!r} was computed "
                "from a forward pass that read the parameter before its previous update was applied (it was "
                "not used inside the forward of the module that owns it, or of a module after it); use "
                "overlap_forward=False for this model")

    def _defer_step(self):
        """overlap_forward's step(): start what backward did not, and leave the updates to the pre-hooks."""
        error = None
        try:
            for unit in self._units:
                if unit not in self._handles:
                    self._handles[unit] = self._start(unit)
        except BaseException as exc:  # wait for what was submitted, as synchronize does
            error = exc
        if error is not None:
            for wait in self._handles.values():
                with contextlib.suppress(BaseException):
                    wait()
            self._reset()
            raise error
        units = [u for u in self._units if u in self._handles]
        if self._priority:
            units.sort(key=lambda u: -self._priority[u])  # stable: equal ones in unit order
        self._pending = [(u, self._handles[u]) for u in units]
        self._pending_unit = {u: i for i, u in enumerate(units)}
        self._applied = 0
        self._step_groups = [{k: v for k, v in g.items() if k != "params"} for g in self._optimizer.param_groups]
        self._zero_pending = None
        self._handles = {}
        self._reset()
        if self._recorded is not None:
            self._agree_order()

    def _apply_until(self, stop):
        """Wait for the pending units up to ``stop`` (most urgent first) and step the optimizer for them."""
        items = self._pending[self._applied:stop]
        self._applied = stop
        for _, wait in items:
            wait()
        params = {p for unit, _ in items for p in unit}
        original = self._optimizer.param_groups
        groups = []
        for hyper, group in zip(self._step_groups, original):
            subset = [p for p in group["params"] if p in params]
            if subset:
                groups.append(dict(hyper, params=subset))
        self._optimizer.param_groups = groups
        try:
            self._optimizer.step()
        finally:
            self._optimizer.param_groups = original
        if self._zero_pending is not None:
            for p in params:
                _zero(p, self._zero_pending)
        if self._applied == len(self._pending):
            self._pending, self._pending_unit, self._applied, self._zero_pending = [], {}, 0, None

    def _apply_pending(self):
        """overlap_forward: apply every update still pending (at synchronize, state_dict, a new step)."""
        if self._applied < len(self._pending):
            self._apply_until(len(self._pending))

    # --- hooks and communication --------------------------------------------------------------------------

    def _add_unit(self, unit):
        unit = _Unit(unit)
        self._units.append(unit)
        for p in unit:
            self._unit_of[p] = unit
            self._unit_by_id[id(p)] = unit
            self._delay[id(p)] = self.backward_passes_per_step
            self._hooks.append(p.register_post_accumulate_grad_hook(_weak_hook(self)))

    def _on_gradient(self, p):
        # Runs once per gradient per backward pass, on the thread that runs backward: kept to a few dict
        # operations keyed by id(p) (a tensor's own __hash__ is a Python call).
        key = id(p)
        left = self._delay[key]
        if left == 0:
            raise AssertionError(
                f"the gradient of {self._names[p]!r} was computed more than backward_passes_per_step="
                f"{self.backward_passes_per_step} times before step()/synchronize(); increase "
                "backward_passes_per_step to accumulate gradients locally, or call step() after each backward")
        self._seen.add(key)
        self._synchronized = False
        self._delay[key] = left - 1
        if left == 1:
            unit = self._unit_by_id[key]
            if len(unit) == 1:
                self._handles[unit] = self._start(unit)
                return
            self._ready[unit] += 1
            if self._ready[unit] == len(unit):
                self._handles[unit] = self._start(unit)

    def _start(self, unit):
        """Start reducing the unit's gradients (zeros where backward produced none); return a function
        that waits for the result and puts it in place."""
        if len(unit) == 1 and self._plain:
            grad = unit[0].grad
            if grad is not None and grad.dtype in _PLAIN_DTYPES and grad.layout is _STRIDED and grad.is_cpu \
                    and not grad.requires_grad and grad.is_contiguous():
                return self._start_plain(unit, grad)
        grads, densified = [], []
        for p in unit:
            grad = p.grad
            if grad is None:
                grad = p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            elif grad.is_sparse:
                if not self.sparse_as_dense:
                    if len(unit) > 1:
                        raise NotImplementedError(
                            f"the gradient of {self._names[p]!r} is sparse and the parameter is in a group; "
                            "pass sparse_as_dense=True or leave it out of groups")
                    return self._start_sparse(p)
                grad = grad.to_dense()
                densified.append((p, grad))
            elif not grad.is_contiguous():
                grad = p.grad = grad.contiguous()
            grads.append(grad)
        priority = self._priority.get(unit, 0)
        if self.op is Average:
            # Divide part before the sum and the rest after it (commlib's Average divides by size after).
            prescale, postscale = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        kwargs = dict(op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                      compression=self.compression, process_set=self.process_set)
        if priority:
            kwargs["priority"] = priority
        if len(unit) == 1:
            handle = C.allreduce_async_(grads[0], name=self._names[unit[0]], **kwargs)
        else:
            handle = C.grouped_allreduce_async_(grads, name="group." + self._names[unit[0]], **kwargs)

        def wait():
            C.synchronize(handle)
            for p, dense in densified:
                p.grad = dense.to_sparse()

        return wait

    def _start_plain(self, unit, grad):
        """The usual case, a dense contiguous CPU gradient of one parameter reduced without compression:
        started through a persistent request (the same checks once, less work per step), waited for
        without a handle wrapper."""
        priority = self._priority.get(unit, 0) if self._priority else 0
        known = self._requests.get(unit)
        if known is None or known[0] != priority:
            prescale, postscale = self._scales
            known = self._requests[unit] = (priority, _cl.persistent_allreduce(
                self._names[unit[0]], op=self.op, prescale_factor=prescale, postscale_factor=postscale,
                process_set=self.process_set, priority=priority))
        handle = known[1].start_(grad.numpy())
        return functools.partial(_cl.synchronize, handle)

    def _start_sparse(self, p):
        """Horovod's sparse allreduce: allgather every rank's (index, value) pairs; the result is the
        concatenation (duplicate indices add up when the optimizer applies it), divided by size for
        Average."""
        if self.op not in (Average, Sum):
            raise NotImplementedError(f"the gradient of {self._names[p]!r} is sparse; sparse gradients are "
                                      f"reduced with Sum or Average, not {self.op.name}")
        grad = p.grad.coalesce()
        name = self._names[p]
        indices = C.allgather_async(grad.indices().t().contiguous(), name=name + ".indices",
                                    process_set=self.process_set)
        values = C.allgather_async(grad.values().contiguous(), name=name + ".values", process_set=self.process_set)
        divisor = set_size(self.process_set) if self.op is Average else 1

        def wait():
            gathered_values = C.synchronize(values)
            gathered_indices = C.synchronize(indices)
            if divisor != 1:
                gathered_values.div_(divisor)
            p.grad = torch.sparse_coo_tensor(gathered_indices.t(), gathered_values, grad.shape)

        return wait

    def synchronize(self):
        """Wait until every gradient is averaged over ranks (starting the ones backward did not produce).
        With ``overlap_forward``, first applies the last step's updates still pending; called with no
        backward since that step, it does only that."""
        if not self._included:
            self._synchronized = True
            return
        self._apply_pending()
        if self.overlap_forward and not self._seen and not self._handles:
            return
        error = None
        try:
            for unit in self._units:
                if unit not in self._handles:
                    self._handles[unit] = self._start(unit)
        except BaseException as exc:  # still wait for what was submitted: no name may stay in flight
            error = exc
        try:
            for wait in self._handles.values():
                try:
                    wait()
                except BaseException as exc:
                    error = error or exc
        finally:
            self._reset()
        if error is not None:
            raise error
        self._synchronized = True
        if self._recorded is not None:
            self._agree_order()

    def _reset(self):
        self._handles.clear()
        self._seen.clear()
        self._ready.clear()
        self._delay = dict.fromkeys(self._delay, self.backward_passes_per_step)
        self._synchronized = False

    def set_backward_passes_per_step(self, passes):
        """Change how many backward passes are accumulated before gradients are communicated."""
        if self._seen:
            raise AssertionError("set_backward_passes_per_step() was called between backward() and step()")
        self.backward_passes_per_step = int(passes)
        self._reset()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within this context ``step()`` does not synchronize (you called ``synchronize()`` yourself)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronize the gradients (unless done already or skipped), then step the wrapped optimizer.

        With a ``closure`` (LBFGS style), the gradients the closure's backward produces are synchronized
        before the wrapped optimizer uses them."""
        if closure is not None:
            if self._seen or self._handles:
                self.synchronize()

            def synchronized_closure():
                with torch.enable_grad():
                    loss = closure()
                self.synchronize()
                return loss

            return self._optimizer.step(synchronized_closure)
        if self.overlap_forward and self._included:
            self._apply_pending()
            if self._should_synchronize and not self._synchronized:
                self._defer_step()
                return None
        if self._should_synchronize and self._synchronized and self._included:
            # Horovod's warning (it would reduce the gradients a second time; commlib does not)
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                          "optimizer.synchronize(); the gradients are not reduced again. Use "
                          "`with optimizer.skip_synchronize(): optimizer.step()`", UserWarning, stacklevel=2)
        if self._should_synchronize and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        return self._optimizer.step()

    def zero_grad(self, set_to_none=True):
        """Zero the gradients; an error between ``backward()`` and ``step()``/``synchronize()``, where it
        would race with the allreduces writing into them (or discard accumulated passes)."""
        if self._seen or self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); the gradients are being reduced in place. Call zero_grad() before "
                "the forward pass (or after step()).")
        if self._applied < len(self._pending):  # overlap_forward: those still reduced are zeroed once applied
            waiting = {p for unit, _ in self._pending[self._applied:] for p in unit}
            self._zero_pending = set_to_none
            for group in self.param_groups:
                for p in group["params"]:
                    if p not in waiting:
                        _zero(p, set_to_none)
            return
        self._optimizer.zero_grad(set_to_none=set_to_none)


class _Unit(tuple):
    """A communication unit: a tuple of parameters that hashes and compares by identity. Units key the
    per-step dicts (handles, requests, priorities), looked up for every gradient of every step: a plain
    tuple's hash would call each tensor's Python ``__hash__``."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__


_STRIDED = torch.strided
#: dtypes whose CPU tensors ``.numpy()`` views as they are (bfloat16 needs a view of its bits: commlib.torch.bridge)
_PLAIN_DTYPES = frozenset(d for d in NUMPY_DTYPES if d is not torch.bfloat16)


def check_momentum(optimizer, compression) -> None:
    """Refuse a compressor that applies momentum itself (DGC, Compression.momentum) around an optimizer
    with momentum of its own (SGD's or RMSprop's ``momentum``, Adam's first beta): a ValueError saying
    what to do (:func:`commlib.validation.optimizer_momentum`)."""
    for index, group in enumerate(optimizer.param_groups):
        betas = group.get("betas")
        key, value = (("momentum", group.get("momentum")) if group.get("momentum") else
                      ("betas[0]", betas[0]) if betas and betas[0] else ("", 0.0))
        message = validation.optimizer_momentum(
            compression, float(value or 0.0), f"{type(optimizer).__name__} (param group {index})", key)
        if message:
            raise ValueError(message)


def _weak_hook(optimizer):
    """A gradient hook that forwards to ``optimizer`` while it exists."""
    ref = weakref.ref(optimizer)

    def hook(p):
        target = ref()
        if target is not None:
            target._on_gradient(p)

    return hook


def _weak_pre_hook(optimizer, module):
    """A forward pre-hook of ``module`` that forwards to ``optimizer`` while it exists."""
    ref = weakref.ref(optimizer)

    def hook(_module, _args):
        target = ref()
        if target is not None:
            target._before_forward(module)

    return hook


def _weak_grad_check(optimizer, p):
    ref = weakref.ref(optimizer)

    def hook(grad):
        target = ref()
        if target is not None:
            target._check_fresh(p)

    return hook


def _zero(p, set_to_none):
    """torch.optim.Optimizer.zero_grad for one parameter."""
    if p.grad is None:
        return
    if set_to_none:
        p.grad = None
    else:
        if p.grad.grad_fn is not None:
            p.grad.detach_()
        else:
            p.grad.requires_grad_(False)
        p.grad.zero_()


def _remove_hooks(handles):
    for handle in handles:
        handle.remove()


def _named_parameters(optimizer, named_parameters):
    """parameter -> name, checked: tuples, unique names, every optimizer parameter named."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}"
                for i, group in enumerate(optimizer.param_groups) for j, p in enumerate(group["params"])}
    named_parameters = list(named_parameters)
    if any(not (isinstance(item, tuple) and len(item) == 2) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, usually "
                         "model.named_parameters()")
    counts = Counter(name for name, _ in named_parameters)
    duplicates = sorted(name for name, n in counts.items() if n > 1)
    if duplicates:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicated: {', '.join(duplicates)}")
    names = {}
    for name, p in named_parameters:
        names.setdefault(p, name)
    unnamed = [f"param_groups[{i}]['params'][{j}] (shape {tuple(p.shape)})"
               for i, group in enumerate(optimizer.param_groups)
               for j, p in enumerate(group["params"]) if p not in names]
    if unnamed:
        raise ValueError(f"named_parameters does not name {len(unnamed)} of the optimizer's parameters: "
                         f"{', '.join(unnamed[:10])}{' ...' if len(unnamed) > 10 else ''}; pass "
                         "model.named_parameters() of the model whose parameters the optimizer updates")
    return names


def _form_units(params, names, groups, process_set):
    """The communication units: one per parameter, or Horovod's ``groups``."""
    if groups is None:
        return [(p,) for p in params]
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must be a list of lists of parameters (torch.Tensor)")
                if p in seen:
                    raise ValueError(f"parameter {names.get(p, tuple(p.shape))!r} appears in more than one group")
                seen.add(p)
        wanted = set(params)
        units = [tuple(p for p in group if p in wanted) for group in groups]
        units = [u for u in units if u]
        units += [(p,) for p in params if p not in seen]
        return units
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups should be a positive integer or a list of lists of parameters, got {groups!r}")
    # Use rank 0's parameter order so every rank forms the same groups.
    root = 0 if process_set is None else process_set.ranks[0]
    order = _cl.broadcast_object([names[p] for p in params], root_rank=root, name="DistributedOptimizer.groups",
                                 **set_kwargs(process_set))
    position = {name: i for i, name in enumerate(order)}
    ordered = sorted(params, key=lambda p: position.get(names[p], len(position)))
    return [tuple(group) for group in split_evenly(ordered, groups)]
