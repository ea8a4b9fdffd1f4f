"""``pipeline=graphed``: the training step after the input dist (on several ranks, with it), replayed as one CUDA
graph.

Below about 16,384 samples per GPU the step is bound by the host: issuing its ~190 kernels through TorchRec's
pipeline, DDP, the compiled dense step and the optimizers takes longer than the GPU needs to run them (7-9 ms
against 3.3 ms of kernels at 8192 on an H200; docs/performance.md). With the MLPerf multi-hot (or 1-hot ids) every
bag has a fixed size, so every full batch has the same shapes, and the step can be recorded once and replayed:

1. The first ``WARMUP_STEPS`` batches train eagerly, as ``pipeline=base`` does (DMP forward with TorchRec's
   input dist, backward, optimizer step); this builds the lazy state a capture must not see for the first time
   (compiled graphs, optimizer state, cuBLAS workspaces).
2. The next full batch becomes the graph's input buffers. Its KJT goes through the sharded module's input dist
   once (``ShardedModule.input_dist``); on one rank that only regroups the features, and the regrouping is kept
   as a gather index, checked once against the real input dist. A rehearsal step then trains on it along the
   path the graph will take: ``compute_and_output_dist`` on the held input dist (TBE forward), the dense forward
   and loss, the backward (the TBE backward with its fused optimizer), and the dense Adagrad step on the
   optimizer's own state, in one pass and bit for bit ``torch.optim.Adagrad``'s (:mod:`dlrm.dense_step`).
3. The next full batch is copied into the buffers and that path is captured (``torch.cuda.graph``), then every
   full batch is copied in (ids gathered into the held input dist, dense features, labels) and the graph
   replayed. Batches of another size (an epoch's last, partial batch) train eagerly as in step 1.

A learning-rate schedule (``optimizer.warmup_steps``, ``optimizer.decay_steps``): FBGEMM's TBE backward reads its
rate on the host when it launches its kernels (``learning_rate_tensor.item()``, passed to the kernels as a float
argument, and a rate tensor on the device refused: ``codegen/training/backward/embedding_backward_split_template.cu``
of fbgemm_gpu 1.6.0 to 1.8.0), so a captured graph holds the rate it was captured with; scaling the gradients
instead is not the same for Adagrad (its accumulator sums the squared gradients). A step whose rates (every param
group's) differ from the previous step's, a warm-up or decay step, therefore trains eagerly as in step 1; once the
rates hold for a second step, that step is a rehearsal at them (step 2, compiling the dense step for the new rate)
and the next full batch is captured anew (the constant rate after a warm-up; the decay's floor
``optimizer.end_lr``). :attr:`GraphedTrainPipeline.path_steps` counts the steps of each kind.

Several ranks (or one, forced with ``ids_all_to_all=True``): the held input dist cannot be rebuilt by a gather,
since each rank's ids come from every rank. With fixed bag sizes every full batch sends the same number of ids
between the same positions, so :class:`dlrm.static_input_dist.StaticInputDist` finds those positions once and
the graph sends only the ids, with fixed split sizes (``torch.distributed.all_to_all_single``); its output is
checked against TorchRec's input dist on the first ``VERIFY_BATCHES`` full batches (:mod:`dlrm.held_batch` holds
the input buffers and does the check). The captured step then holds the ids all-to-all, the TBE forward, the
output-dist all-to-all, the dense forward and backward, the backward all-to-all, the TBE backward with its fused
optimizer, the dense gradients' all-reduce (one flat fp32 buffer, scaled by the world size as DDP scales it, the
gradients in the order DDP's rebuilt bucket holds them) and the dense Adagrad step. The host copies the next batch
into the input buffers and replays.

Ids ahead (``pipeline.input_dist_group=dedicated``, the input dist on a process group of its own): as TorchRec's
sparse-dist pipeline sends the next batch's input dist on its data-dist stream, the captured step sends the
*next* batch's ids instead of its own, on the dedicated group's communicator and a CUDA stream of their own,
beside the step's lookups and dense work, into a receive buffer that the step writes into the held input
dist after its backward, for the next replay. The host loads the next batch's ids into the buffer the step sends
(the pipeline keeps two batches ahead on the device) and the batch's dense features and labels into theirs. A
step after an eager one, or whose next batch has another shape, sends its own ids in line first; a step whose
next batch trains eagerly has sent ids nobody reads. :attr:`GraphedTrainPipeline.ids_received_ahead` counts the
steps that trained on ids the step before sent. Evaluation sends its ids in line.

Evaluation (:meth:`GraphedTrainPipeline.evaluate`): the same for the forward. Evaluation batches are padded to
one size (:func:`dlrm.data.eval_batches`), so after one eager batch (``EVAL_WARMUP_BATCHES``) the next becomes
the forward's input buffers with a held input dist of its own (ids all-to-all with fixed splits on several ranks,
checked against TorchRec's on the first ``VERIFY_BATCHES``), runs along the capture path, and the forward
(the ids all-to-all, the TBE forward, the output-dist all-to-all, the dense forward) is captured on the next and
replayed for every batch of that shape; a batch of another shape runs eagerly. Bag sizes are checked on the
device and read once at the end of each pass. At 32768 rows a batch the forward is bound by the GPU rather than
the host, so the graph gains less than for the step: 9.6-9.8 M samples/s against 9.1-9.2 M eagerly on an H200
(docs/performance.md).

The values are those of the eager pipelines bit for bit (``tests/test_graphed.py``: losses, tables, dense
parameters and optimizer state against ``pipeline=sparse_dist``, on one and two ranks, with a schedule too).
Row_wise and table_row_wise tables on several ranks: TorchRec's input dist sends each id to the rank holding its
row, so how many ids each rank receives changes every batch. The graph sends the whole bags of each such feature
instead (fixed sizes again), row_wise ones to every rank, table_row_wise ones to every rank of the table's host;
each rank looks up the ids in its rows (less its first row) with weight 1 and the others as row 0 with weight 0, so
the TBE pools and updates as it would on TorchRec's ids (``per_sample_weights``; a weight-0 id adds an exact 0 to
the forward and a 0 gradient that leaves the row and its Adagrad state bit for bit, ``tests/test_graphed.py``). The
output dists (the partial sums' reduce-scatters, and table_row_wise's all-to-all across hosts) stay TorchRec's.
What a replay cannot follow is refused (:func:`check_graphed`): offload, a CPU device, and on several ranks grid_shard
tables (each column shard split by rows within a host, not sent as whole bags) and a reduced-precision dense
all-reduce. The capture needs the process's current CUDA stream to be a stream of its own, set before the model is built
(:func:`use_capture_stream`): autograd binds each parameter's gradient accumulation to the stream current when
DDP first registers it, and the legacy default stream cannot take part in a capture.

Bag sizes are checked on the device without a host sync; the flag is read every ``CHECK_EVERY`` steps, and a batch
whose bag sizes differ from the captured ones stops the run with :class:`dlrm.model.BatchError`.
"""

from __future__ import annotations

import collections
import logging
from typing import Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.types import ShardedModule

from dlrm.comms import has_dedicated_input_dist
from dlrm.config import Config
from dlrm.dense_step import DenseStep
from dlrm.errors import ConfigError
from dlrm.held_batch import HeldBatch
from dlrm.model import BatchError
from dlrm.static_input_dist import NOT_SENT, StaticInputDist

log = logging.getLogger(__name__)

WARMUP_STEPS = 2  # eager steps before the rehearsal: the first compiles, the second runs warm
CHECK_EVERY = 100  # steps between host reads of the bag-size flag
EVAL_WARMUP_BATCHES = 1  # eager evaluation batches before the held one (the first compiles the eval forward)


def check_graphed(
    cfg: Config, world_size: int, device: torch.device, sharding_types: Optional[Sequence[str]] = None
) -> None:
    """Refuse a run that ``pipeline=graphed`` cannot replay exactly.

    Args:
        cfg: the whole config; world_size: ranks in the job; device: this rank's device.
        sharding_types: the plan's sharding type of every table (after planning); None: judged from
            ``sharding.sharding_types`` alone.

    Raises:
        ConfigError: not CUDA; ``offload`` other than ``none``; data_parallel tables (the compiled dense
            Adagrad step does not take their weights); on several ranks, a plan (or
            ``sharding.sharding_types``) with grid_shard tables, whose input dist sends each id to the rank
            holding its row within a host (the all-to-all's sizes change every batch; row_wise and table_row_wise
            tables are taken: :mod:`dlrm.static_input_dist` sends them whole bags), or ``perf.allreduce_dtype``
            other than fp32 (the graph all-reduces the dense gradients in fp32).
    """
    if cfg.pipeline.name != "graphed":
        return
    key = "config key `pipeline.name`: pipeline=graphed"
    if device.type != "cuda":
        raise ConfigError(f"{key} replays a CUDA graph, but this run is on {device.type}; use pipeline=sparse_dist")
    if cfg.offload.name != "none":
        raise ConfigError(f"{key} is not built for offload={cfg.offload.name}; use offload=none or pipeline=prefetch")
    if "data_parallel" in (sharding_types if sharding_types is not None else cfg.sharding.sharding_types or ()):
        # torch.compile of the dense Adagrad step stops with a FakeTensor error on a data_parallel table's weights
        # (torch 2.11, H200); the CPU tests never compile, so they cannot catch it
        raise ConfigError(
            f"{key} compiles the dense Adagrad step into the graph, and that compile fails on data_parallel tables' "
            "weights; keep data_parallel out of the plan (e.g. sharding.sharding_types=[table_wise,column_wise]) or "
            "use pipeline=sparse_dist"
        )
    if world_size == 1:
        return
    types = sharding_types
    if types is None and cfg.sharding.sharding_types and set(cfg.sharding.sharding_types) <= set(NOT_SENT):
        types = list(cfg.sharding.sharding_types)
    refused = sorted(set(types or ()) & set(NOT_SENT))
    if refused:
        raise ConfigError(
            f"{key} sends the ids with fixed splits on several ranks (row_wise and table_row_wise tables as whole "
            f"bags), but {'/'.join(refused)} tables send each id to the rank that holds its row, so the "
            "all-to-all's sizes change with every batch; use sharding=table_wise, column_wise, row_wise or "
            "table_row_wise (or per-table sharding.constraints), or pipeline=sparse_dist"
        )
    if cfg.perf.allreduce_dtype != "fp32":
        raise ConfigError(
            f"{key} all-reduces the dense gradients in fp32 inside the graph, but perf.allreduce_dtype="
            f"{cfg.perf.allreduce_dtype}; use perf.allreduce_dtype=fp32 or pipeline=sparse_dist"
        )


def use_capture_stream(device: torch.device) -> None:
    """Make a new stream the calling thread's current CUDA stream (call before the model is built; see the module
    docstring). Everything this thread queues afterwards goes to it, as it would to the default stream."""
    torch.cuda.set_stream(torch.cuda.Stream(device))


class GraphedTrainPipeline:
    """A training pipeline with TorchRec's ``progress(iterator)`` interface that replays one CUDA graph per full
    batch (module docstring).

    Args:
        model: the DMP-wrapped model; its one sharded module is an ``EmbeddingBagCollection`` fed the batch's KJT.
        optimizer: every optimizer of the model (the fused TBE optimizers plus ``dense``), for eager steps.
        dense: the optimizer of the parameters not fused into the TBE backward; its parameter groups must be
            ``torch.optim.Adagrad``'s (``sum`` and ``step`` state).
        device: this rank's device.
        capture: false replays nothing and runs the capture path eagerly instead (a CPU check of everything but
            the CUDA graph itself).
        ids_all_to_all: send the ids with fixed splits (:class:`dlrm.static_input_dist.StaticInputDist`) and
            all-reduce the dense gradients inside the step; None: on several ranks. True on one rank runs the
            several-rank path there (its collectives are issued, over one rank).
        ids_ahead: with the ids all-to-all, send the next batch's ids during this step, on a stream of their own
            (module docstring, "Ids ahead"); None: when the input dist runs on a process group of its own
            (``pipeline.input_dist_group=dedicated``).

    On several ranks every rank's batch of a step must have the same shape, full or partial alike (the trainer's
    loaders split each global batch evenly): a rank that replays while another trains eagerly would issue other
    collectives.

    ``progress`` returns ``(loss, logits, labels)`` (detached; fresh tensors each step) and raises
    ``StopIteration`` after the last batch. ``path_steps`` counts the steps trained ``eager`` (warm-up, a batch of
    another shape, a step whose learning rates differ from the previous step's), as a ``rehearsal`` (the capture
    path run eagerly on a batch or rates newly held) and through the ``graph`` (captured or replayed; with
    ``capture=False`` the capture path run eagerly).

    Raises:
        ConfigError: a model with more than one sharded module, or a dense optimizer that is not Adagrad; with
            the ids all-to-all: DDP with a comm hook other than the fp32 all-reduce's, and (on the held batch) an
            input dist that routes ids by value or whose static form differs from TorchRec's on one of the first
            ``VERIFY_BATCHES`` full batches.
        BatchError: a batch's bag sizes differ from the captured batch's (found at most ``CHECK_EVERY`` steps
            later).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dense: torch.optim.Optimizer,
        device: torch.device,
        capture: bool = True,
        ids_all_to_all: Optional[bool] = None,
        ids_ahead: Optional[bool] = None,
    ) -> None:
        self._model = model
        # the unwrapped module: DDP's reducer cannot be replayed (its logging syncs the host); the several-rank
        # path all-reduces the dense gradients itself (DenseStep.reduce)
        self._net = model.module
        self._optimizer = optimizer
        self._dense = dense
        self._device = device
        self._capture = capture
        sharded = [m for m in model.modules() if isinstance(m, ShardedModule)]
        if len(sharded) != 1:
            raise ConfigError(
                f"config key `pipeline.name`: pipeline=graphed handles one sharded EmbeddingBagCollection, this "
                f"model has {len(sharded)} sharded modules; use pipeline=sparse_dist"
            )
        self._sharded: ShardedModule = sharded[0]
        self._copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._queue: Deque[Batch] = collections.deque()  # the next batches, copied to the device
        self._exhausted = False
        self._steps = 0
        self._held: Optional[HeldBatch] = None  # the training step's input buffers and held input dist
        self._graph: Optional[torch.cuda.CUDAGraph] = None
        self._out: Tuple[torch.Tensor, ...] = ()
        self._grads: List[torch.Tensor] = []  # the graph's gradient buffers, kept alive with it
        self._stepped: List[torch.Tensor] = []  # the dense parameters the graph steps
        self._last_rates: Tuple[float, ...] = ()  # every param group's rate at the previous step
        self._held_rates: Optional[Tuple[float, ...]] = None  # the rates of the last rehearsal (and of the graph)
        self.path_steps: Dict[str, int] = {"eager": 0, "rehearsal": 0, "graph": 0}
        world = dist.get_world_size() if dist.is_initialized() else 1
        self._ids_all_to_all = world > 1 if ids_all_to_all is None else ids_all_to_all
        self._dense_step = DenseStep(dense, model, capture and device.type == "cuda", reduce=self._ids_all_to_all)
        self._ahead = self._ids_all_to_all and (
            has_dedicated_input_dist(self._sharded) if ids_ahead is None else ids_ahead
        )
        # the stream of the ids sent ahead; on CPU they are sent in line
        self._ids_stream = torch.cuda.Stream(device) if self._ahead and device.type == "cuda" else None
        self._received = False  # the held input dist holds the ids of the next batch, sent ahead by this step
        self.ids_received_ahead = 0  # steps whose ids came from the step before (ids ahead)
        # evaluation (evaluate): the forward's input buffers, graph and outputs, and the batches seen
        self._eval_held: Optional[HeldBatch] = None
        self._eval_graph: Optional[torch.cuda.CUDAGraph] = None
        self._eval_out: Tuple[torch.Tensor, ...] = ()
        self._eval_batches = 0

    # ------------------------------------------------------------------------------------------ interface
    def progress(self, it: Iterator[Batch]) -> Tuple[torch.Tensor, ...]:
        """Train one step on the next batch of ``it`` (eagerly, as the rehearsal, or as a graph replay) while the
        batch after it is copied to the device.

        Returns:
            The model's outputs, detached copies: ``(loss, logits, labels)``, loss a float32 scalar, logits
            float32 ``[B]``, labels ``[B]``; with :class:`dlrm.model.DLRMTrainSkipNonFinite` also ``ok`` (bool
            scalar).

        Raises:
            StopIteration: ``it`` had no batch left.
            BatchError: a batch since the last check had other bag sizes than the captured one (checked every
                ``CHECK_EVERY`` steps).
        """
        batch = self._take(it)
        self._steps += 1
        rates = tuple(float(g["lr"]) for g in self._optimizer.param_groups)
        steady, self._last_rates = rates == self._last_rates, rates
        if (
            (self._held is not None and not self._held.fits(batch))
            or self._steps <= WARMUP_STEPS
            or not steady  # a warm-up or decay step: its rate is not one a graph can hold (module docstring)
        ):
            self.path_steps["eager"] += 1
            self._received = False
            return self._eager_step(batch)
        received, self._received = self._received, False
        first = self._held is None  # on the batch that becomes the input buffers
        if first:
            self._held = HeldBatch(self._sharded, batch, self._ids_all_to_all)
        else:
            if received:  # its ids were sent during the previous step
                self._held.load_dense(batch)
                self.ids_received_ahead += 1
            else:
                self._held.load(batch)
            if self._steps % CHECK_EVERY == 0:
                self.check_bag_sizes()
        sent = self._held.verify(self._sharded, "full batch", "after the warm-up")
        if self._ahead:
            self._prepare_ahead(received or sent)
        rehearsal = first or rates != self._held_rates
        if rehearsal:
            if self._held_rates is not None:
                log.info(
                    "learning rate held at %s from step %d: the training step is captured anew", rates, self._steps
                )
            self._held_rates = rates
            self._drop_graph()
        self.path_steps["rehearsal" if rehearsal else "graph"] += 1
        if rehearsal or not self._capture:
            self._optimizer.zero_grad()
            return tuple(t.clone() for t in self._graph_step())
        if self._graph is None:
            self._record()  # capturing runs the step counters' host increment once, for this batch
        else:
            self._dense_step.advance_steps(self._stepped)  # a replay does not run the host increment
        assert self._graph is not None
        self._graph.replay()
        return tuple(t.clone() for t in self._out)

    def _prepare_ahead(self, held_now: bool) -> None:
        """Ids ahead: make the held input dist hold this batch's ids (sent in line unless ``held_now``), then load
        the next batch's ids into the buffer the step sends, if it has this batch's shape (else the step sends
        this batch's again, and the next step sends its own in line)."""
        held = self._held
        assert held is not None and held.static_dist is not None
        if not held_now:
            held.static_dist.run(held.batch.sparse_features.values())
        nxt = self._queue[0] if self._queue else None
        if nxt is not None and held.fits(nxt):
            held.load_ids(nxt)
            self._received = True

    def detach(self) -> torch.nn.Module:
        """The model, for evaluation (its forward is TorchRec's again outside the capture path)."""
        return self._model

    def evaluate(
        self, batches: Iterable[Tuple[Batch, torch.Tensor]]
    ) -> Iterator[Tuple[Tuple[torch.Tensor, ...], torch.Tensor]]:
        """Evaluate the model (in eval mode: the caller's ``model.eval()``) on ``batches``, through a captured
        forward (module docstring, "Evaluation").

        Args:
            batches: ``(batch, weight)`` pairs as :func:`dlrm.data.eval_batches` yields them; on several ranks
                every rank's batches of a pass have the same shapes in the same order (as that function pads
                them).

        Yields:
            ``(outputs, weight)``: ``outputs`` the model's, fresh detached tensors: ``(loss, logits, labels)``,
            loss a float32 scalar, logits float32 ``[B]``, labels ``[B]``, with
            :class:`dlrm.model.DLRMTrainSkipNonFinite` also ``ok``; ``weight`` as given.

        Raises:
            BatchError: after the last batch, if a batch of the captured shape had other bag sizes (one host sync
                per pass; collective with the ids all-to-all).
            ConfigError: the held input dist cannot be rebuilt or sent with fixed splits (as for training).
        """
        for batch, weight in batches:
            yield self._eval_step(batch), weight
        held = self._eval_held
        if held is not None:
            bad = held.any_bad()
            held.bad.zero_()
            if bad:
                raise BatchError(
                    "pipeline=graphed: an evaluation batch's bag sizes (KJT lengths) differ from those of the batch "
                    "the forward was captured with; replays need fixed bag sizes: use data.multi_hot=true (or "
                    "1-hot ids) with a loader of fixed bags, or pipeline=sparse_dist"
                )

    def check_bag_sizes(self) -> None:
        """Raise :class:`dlrm.model.BatchError` if a batch since the last check had other bag sizes than the
        captured batch (one host sync; ``progress`` also checks every ``CHECK_EVERY`` steps). With the ids
        all-to-all it is collective: every rank calls it, and all raise if one rank's batch differed (a rank that
        stopped alone would leave the others waiting in the next all-to-all)."""
        if self._held is not None and self._held.any_bad():
            raise BatchError(
                "pipeline=graphed: a batch's bag sizes (KJT lengths) differ from those of the batch the step was "
                "captured with; replays need fixed bag sizes: use data.multi_hot=true (or 1-hot ids) with a "
                "loader of fixed bags, or pipeline=sparse_dist"
            )

    # ------------------------------------------------------------------------------------------ steps
    @torch.no_grad()
    def _eval_step(self, batch: Batch) -> Tuple[torch.Tensor, ...]:
        """One evaluation batch: eagerly (the first, and any of another shape), along the capture path (the
        batch that becomes the input buffers; every one with ``capture=False``), or as a replay."""
        batch = batch.to(self._device)
        self._eval_batches += 1
        held = self._eval_held
        if (held is not None and not held.fits(batch)) or self._eval_batches <= EVAL_WARMUP_BATCHES:
            return self._model(batch)[1]
        rehearsal = held is None
        if held is None:
            held = self._eval_held = HeldBatch(self._sharded, batch, self._ids_all_to_all)
        else:
            held.load(batch)
        held.verify(self._sharded, "evaluation batch", "of the captured shape")
        if rehearsal or not self._capture:  # cloned: the labels are the input buffer itself
            return tuple(t.clone() for t in self._eval_forward())
        if self._eval_graph is None:
            torch.cuda.synchronize(self._device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=torch.cuda.current_stream(self._device)):
                self._eval_out = self._eval_forward()
            self._eval_graph = graph
            log.info("evaluation forward captured as a CUDA graph for batch %d", held.batch.labels.numel())
        self._eval_graph.replay()
        return tuple(t.clone() for t in self._eval_out)

    def _eval_forward(self) -> Tuple[torch.Tensor, ...]:
        """(The ids all-to-all,) the forward from the held evaluation input dist: what the evaluation graph
        records."""
        held = self._eval_held
        assert held is not None
        if held.static_dist is not None:
            held.static_dist.run(held.batch.sparse_features.values())
        with held.forward_from_input_dist(self._sharded):
            return self._net(held.batch)[1]

    def _eager_step(self, batch: Batch) -> Tuple[torch.Tensor, ...]:
        self._optimizer.zero_grad()
        loss, out = self._model(batch)
        with self._dense_step.record_ready_order():
            loss.backward()
        self._optimizer.step()
        return out

    def _graph_step(self) -> Tuple[torch.Tensor, ...]:
        """(The ids all-to-all,) forward from the held input dist, backward, (the dense gradients' all-reduce,)
        dense Adagrad: what the graph records."""
        held = self._held
        assert held is not None
        static, recv = held.static_dist, None
        if static is not None and self._ahead:
            recv = self._send_next_ids(static, held.batch.sparse_features.values())
        elif static is not None:
            static.run(held.batch.sparse_features.values())
        with held.forward_from_input_dist(self._sharded):
            loss, out = self._net(held.batch)
        loss.backward()
        self._dense_step.reduce()
        self._dense_step.step()
        if static is not None and recv is not None:
            if self._ids_stream is not None:
                torch.cuda.current_stream(self._device).wait_stream(self._ids_stream)
            static.place(recv)  # after the lookups and the TBE backward have read this batch's ids
        return out

    def _send_next_ids(self, static: StaticInputDist, values: torch.Tensor) -> torch.Tensor:
        """Ids ahead: issue the all-to-all of ``values`` (the next batch's ids) on the ids stream, beside the
        step's compute (in line on CPU); returns the receive buffer, which the step places after its backward."""
        if self._ids_stream is None:
            return static.send(values)
        self._ids_stream.wait_stream(torch.cuda.current_stream(self._device))  # the loaded ids
        with torch.cuda.stream(self._ids_stream):
            return static.send(values)

    def _drop_graph(self) -> None:
        """Release the captured step (its rates are no longer the optimizer's), its outputs and gradient buffers."""
        if self._graph is not None:  # its last replay finishes before its memory pool goes back to the allocator
            torch.cuda.synchronize(self._device)
        self._graph, self._out, self._grads, self._stepped = None, (), [], []

    def _record(self) -> None:
        self._optimizer.zero_grad()  # the graph allocates its own gradient buffers
        torch.cuda.synchronize(self._device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream(self._device)):
            self._out = self._graph_step()
        stepped = [p for g in self._dense.param_groups for p in g["params"] if p.grad is not None]
        self._grads = [p.grad for p in stepped]
        self._stepped = stepped
        self._graph = graph
        log.info("training step captured as a CUDA graph at step %d; replayed from here on", self._steps)

    # ------------------------------------------------------------------------------------------ batches
    def _take(self, it: Iterator[Batch]) -> Batch:
        """The next batch on the device; the copies of the batches after it (one, two with ids ahead, whose step
        reads the next batch's ids) are issued to run beside this step."""
        if not self._queue:
            if self._exhausted:  # the last iterator ended; the next call starts on the iterator it is given
                self._exhausted = False
                raise StopIteration
            self._queue.append(self._to_device(next(it)))
        batch = self._queue.popleft()
        if self._copy_stream is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_stream(self._copy_stream)
            for b in (batch, *self._queue):
                b.record_stream(current)
        while not self._exhausted and len(self._queue) < 1 + self._ahead:
            try:
                self._queue.append(self._to_device(next(it)))
            except StopIteration:
                self._exhausted = True
        return batch

    def _to_device(self, batch: Batch) -> Batch:
        if self._copy_stream is None:
            return batch.to(self._device)
        with torch.cuda.stream(self._copy_stream):
            return batch.to(self._device, non_blocking=True)
