"""A tiny model and a tiny env where one token earns reward, for fast trainer tests (learning, resume).

* Tokenizer: word-level over 16 letters + 4 specials (20 tokens), with a chat template.
* Model: random-init 1-layer Llama (hidden 32), deterministic from the spec's seed.
* Env ``tiny-target-token-v0``: agent "a" then agent "b" each reply; the episode reward is the share of the
  reply tokens (both agents, ``RESPONSE_TOKENS`` each) that are the target letter "k". Random init: ~1/16.
  A reply without any "k" is an invalid call (format penalty 0.05), so per-agent rewards differ and the
  ``drmas`` and ``grpo`` estimators give different advantages.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import numpy as np
import torch

import drmas_envs
from drmas_envs.core import ListTaskSource, Outcome, Task, TextAECEnv, Turn
from drmas_train.model.models import LoadedModel
from drmas_train.run.config import load_config

ENV_ID = "tiny-target-token-v0"
LETTERS = "abcdefghijklmnop"
TARGET = "k"
RESPONSE_TOKENS = 4
SPECIALS = ["<pad>", "<eos>", "<unk>", "<go>"]


class TargetTokenEnv(TextAECEnv):
    """Two agents; reward = share of their reply tokens equal to the target letter."""

    possible_agents = ["a", "b"]
    metadata = {**TextAECEnv.metadata, "name": "tiny_target_token"}

    def __init__(self, render_mode=None):
        tasks = ListTaskSource([Task(f"t{i}", "tiny", " ".join(LETTERS[i : i + 3]), TARGET) for i in range(6)])
        super().__init__(tasks, format_penalty=0.05, render_mode=render_mode)

    def _start_episode(self):
        self._said = []
        return "a"

    def _prompt(self, agent):
        return "", f"{agent} {self.task.question}"

    def _act(self, agent, text):
        self._said.append(text.split())
        return Turn(valid=TARGET in self._said[-1], next_agent="b" if agent == "a" else None)

    def _episode_outcome(self):
        hits = sum(tok == TARGET for said in self._said for tok in said)
        return Outcome(hits / (RESPONSE_TOKENS * len(self.possible_agents)), hits > 0)


if ENV_ID not in drmas_envs.registry:
    drmas_envs.register(ENV_ID, TargetTokenEnv)


def tiny_tokenizer():
    """20-token word-level tokenizer (letters + specials) with a one-line chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + list(LETTERS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<go>"]})
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}<go>{% endif %}"
    return fast


def tiny_loader(spec, model_id):
    """``build_models`` loader: the tiny Llama + tokenizer, seeded by ``spec.seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return LoadedModel(model_id, model, tok, spec)


class UpdateHold:
    """Holds one model's updates on the training ranks until the test releases them, without polling.

    The test process takes an exclusive ``flock`` on ``path`` (:meth:`hold`); every forward pass with gradients of
    ``model_id`` under :meth:`loader` (its PPO update on a training rank, not its generation) first takes a shared
    lock on the same file, so it blocks in the kernel until :meth:`release`. The rank is another process: a lock on
    a file both see is what crosses the boundary, a path per test keeps two test sessions apart, and the kernel drops
    the lock if the test process dies. A hold is released by itself after ``timeout_s`` and marks itself
    :attr:`expired` (the fixture then fails the test), so a loop that never reaches the release point fails instead
    of hanging. A forward with gradients of the held model in the holding process itself would wait on its own lock:
    it raises instead (only the Ray path's ranks may run one).
    """

    def __init__(self, path: str | os.PathLike, model_id: str = "m2", timeout_s: float = 600.0):
        self.path, self.model_id, self.timeout_s = Path(path), model_id, timeout_s
        self.expired = False  # released by the timeout, not by the test
        self._fd: int | None = None
        self._timer: threading.Timer | None = None
        self._holder_pid = os.getpid()
        self._lock = threading.Lock()
        self.path.touch()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def hold(self) -> None:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                self._timer = threading.Timer(self.timeout_s, self._expire)
                self._timer.daemon = True
                self._timer.start()

    def release(self) -> None:
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def _expire(self) -> None:
        with self._lock:
            if self._timer is threading.current_thread():  # else released (or held again) meanwhile: not this hold's
                self.expired = True
                self._release_locked()

    def __getstate__(self):  # pickled to the ranks with :meth:`loader`: the lock and its timer stay with the holder
        return {"path": self.path, "model_id": self.model_id, "timeout_s": self.timeout_s, "holder_pid": self._holder_pid}

    def __setstate__(self, state):
        self.path, self.model_id, self.timeout_s = state["path"], state["model_id"], state["timeout_s"]
        self.expired, self._fd, self._timer, self._lock = False, None, None, threading.Lock()
        self._holder_pid = state["holder_pid"]

    def _wait_while_held(self, module, args):
        if torch.is_grad_enabled():
            with open(self.path, "rb") as f:
                if os.getpid() == self._holder_pid:  # this object or a copy of it in the holding process
                    try:
                        fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        raise RuntimeError(f"{self.model_id}'s update ran in the process holding its UpdateHold: it "
                                           "would wait on its own lock (only a rank in another process can be held)") from None  # fmt: skip
                    return
                fcntl.flock(f, fcntl.LOCK_SH)  # blocks while the test holds the exclusive lock

    def loader(self, spec, model_id):
        """:func:`tiny_loader`, whose model ``model_id``'s updates wait while the hold is taken: a model whose update
        the test ends at a point it chooses, beside one that trains freely."""
        loaded = tiny_loader(spec, model_id)
        if model_id == self.model_id:
            loaded.model.register_forward_pre_hook(self._wait_while_held)
        return loaded


def tiny_config(run_dir, *overrides: str):
    """A quick config for the tiny env: 2 tasks x G=8 per iteration, 4-token replies, lr 3e-3, no TensorBoard, and
    drmas's loss layout (no padding, one token mean per shuffled mini-batch), whose objective does not depend on the
    number of ranks, so that the Ray path can be compared with the single process."""
    from pathlib import Path

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    yaml = Path(run_dir).parent / f"{Path(run_dir).name}.yaml"
    yaml.write_text(
        f"""
run: {{dir: {run_dir}, iterations: 30, progress: false, tensorboard: false, plot: false, num_threads: 1}}
env: {{id: {ENV_ID}, data: null}}
models: {{m: {{name_or_path: tiny}}}}
agents: {{a: m, b: m}}
rollout: {{batch_size: 2, group_size: 8, max_new_tokens: {RESPONSE_TOKENS}, max_prompt_tokens: 32}}
optim: {{lr: 3.0e-3, weight_decay: 0.0}}
algorithm: {{batch_padding: none, loss_micro_batch_size: null, mini_batch_order: shuffle}}
"""
    )
    return load_config(str(yaml), list(overrides))


def tiny_samples(model, n: int = 8, seed: int = 0, model_id: str = "m"):
    """``n`` on-policy samples (old log-probs = the model's own) of random tiny-vocabulary token ids."""
    from drmas_train.collect.samples import Sample
    from drmas_train.model.logprobs import forward_logprobs

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = rng.integers(4, 20, int(rng.integers(2, 6))).tolist()
        r = rng.integers(4, 20, int(rng.integers(1, 5))).tolist()
        out.append(Sample(f"u{i % 2}", f"t{i}", "a", model_id, 0, 0, p, r, [0.0] * len(r), [1] * len(r)))
    with torch.no_grad():
        lp, _, _ = forward_logprobs(model, [s.prompt_ids for s in out], [s.response_ids for s in out], pad_token_id=0)
    for b, s in enumerate(out):
        s.old_logprobs = lp[b, : len(s.response_ids)].tolist()
    return out


def checkpoint_weights(run_dir, iteration: int) -> dict[str, torch.Tensor]:
    """Every tensor of every model of checkpoint ``iteration`` of ``run_dir``, keyed ``<model id>/<tensor name>``
    (:func:`drmas_train.run.checkpoint.saved_model_weights`)."""
    from drmas_train.run.checkpoint import saved_model_weights

    return saved_model_weights(run_dir / "checkpoints" / f"iter_{iteration:06d}")


def assert_whole_groups(samples, model_ids, n_groups: int, group_size: int) -> None:
    """Each model of ``model_ids`` has ``n_groups`` prompt groups (``uid``) among ``samples``, each with all of its
    ``group_size`` episodes (``traj_uid``): what an update of the asynchronous loop consumes."""
    for mid in model_ids:
        per_uid: dict[str, set[str]] = {}
        for s in samples:
            if s.model_id == mid:
                per_uid.setdefault(s.uid, set()).add(s.traj_uid)
        assert len(per_uid) == n_groups and all(len(t) == group_size for t in per_uid.values()), (mid, per_uid)
