"""Rollouts with vLLM, colocated with the policy on the same GPU(s).

Imported only when ``backend="vllm"``; nothing else in the trainer imports
vLLM. The engine starts with ``enable_sleep_mode`` so it can hand its weights
and KV cache back while the policy trains (``sleep``), and receives the new
policy weights after every update through the model's own ``load_weights``
(run on each vLLM worker via ``collective_rpc``, so tensor-parallel shards
take their slice). It reports the log-probabilities it sampled with, which is
what truncated importance sampling needs.

One engine only: ``num_inference_engines`` > 1 and a non-colocated layout are
not offered by this trainer (they are reported as inert at start).

Not yet run: the machines this trainer is tested on have no vLLM build (the CPU
CI machines, and a GPU machine without the package). Everything around the
engine (the :class:`RolloutEngine` contract, TIS from engine log-probs, the
inert-knob report) is tested with the HF engine and engine-reported log-probs.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from trainer.rollout import BackendUnavailable, Generation, RolloutEngine, SamplingParams

try:
    import vllm
except ImportError as exc:  # vLLM has no wheels for most machines; say what to do.
    raise BackendUnavailable(
        "backend='vllm' needs the vllm package, which is not installed here "
        "(pip install 'sweepkit[vllm]' on a CUDA machine), or set backend='hf'"
    ) from exc


def _load_weights_on_worker(worker, named_tensors):
    worker.model_runner.model.load_weights(weights=named_tensors)


class VLLMEngine(RolloutEngine):
    reports_logprobs = True

    @classmethod
    def inert_knobs(cls, cfg) -> dict[str, str]:
        reasons = dict.fromkeys(("num_inference_engines", "colocate_all"),
                                "this trainer runs one vLLM engine, colocated with the policy")
        reasons["compile_decode"] = "vLLM compiles its own model (enforce_eager turns that off)"
        reasons["decode_attention"] = "vLLM picks its own attention backend"
        reasons["decode_pdl"] = "vLLM launches its own kernels"
        return reasons

    @classmethod
    def from_config(cls, cfg, *, model, tokenizer, device, max_rows) -> "VLLMEngine":
        # vLLM loads from a directory; the policy may be built in memory (tiny-random,
        # random:<shape>), so hand it the policy's own weights and tokenizer.
        staging = tempfile.mkdtemp(prefix="vllm-policy-")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # sync_weights sends a function and tensors to the engine's worker processes, which
        # vLLM's V1 engine refuses to pickle unless told it may.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        extra = {}
        if "logprobs_mode" in {field.name for field in dataclasses.fields(vllm.EngineArgs)}:
            # The default reports log-probs before temperature; TIS compares them with the
            # trainer's pi_old, which is of the tempered distribution that was sampled.
            extra["logprobs_mode"] = "processed_logprobs"
        llm = vllm.LLM(
            model=staging,
            tokenizer=staging,
            dtype="bfloat16" if cfg.dtype in ("auto", "bfloat16") else "float32",
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=cfg.inference_tp,
            enable_sleep_mode=True,
            seed=cfg.seed,
            max_model_len=cfg.max_prompt_length + cfg.max_generate_length,
            **extra,
        )
        return cls(llm, device=device, pad_id=tokenizer.pad_token_id)

    def __init__(self, llm, *, device, pad_id):
        self.llm = llm
        self.asleep = False
        self.device = device
        self.pad_id = pad_id

    @classmethod
    def check_available(cls) -> None:
        """Importing this module already raised BackendUnavailable if vLLM is missing."""

    def generate(self, prompts, params: SamplingParams) -> Generation:
        sampling = vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_tokens=params.max_new_tokens, seed=params.seed, logprobs=0,
        )
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        rows, logprobs, stopped = [], [], []
        for output in outputs:  # vLLM returns requests in submission order
            for sample in output.outputs:
                rows.append(list(sample.token_ids))
                logprobs.append([position[token].logprob for token, position in zip(sample.token_ids, sample.logprobs)])
                stopped.append(sample.finish_reason == "stop")
        return Generation.from_rows(rows, stopped=stopped, pad_id=self.pad_id, device=self.device, logprobs=logprobs)

    def sync_weights(self, model) -> None:
        named = [(name, tensor.detach()) for name, tensor in model.state_dict().items()]
        self.llm.collective_rpc(_load_weights_on_worker, args=(named,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    def sleep(self) -> None:
        if not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


ENGINE = VLLMEngine
