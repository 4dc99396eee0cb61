"""Parameter-efficient fine-tuning: the methods that adapt a frozen ViT, and the adapter folders people exchange.

Methods (one per run; the head is always trained):

- ``lora`` and ``dora`` (Hu et al. 2021; Liu et al. 2024) through HF ``peft``: a low-rank update B A beside the
  chosen dense layers of the blocks, by default the fused ``qkv`` (one update for queries, keys and values) and
  the MLP's ``fc1`` and ``fc2``. The targets ``q``, ``k`` and ``v`` put a LoRA on those rows of the fused layer
  alone, as HF's separate query and value layers have it: one update of rank ``r`` per part, held as a rank
  ``r x parts`` LoRA on ``qkv`` whose other rows stay zero.
- ``vpt-shallow`` and ``vpt-deep`` (Jia et al. 2022): learned prompt tokens after the prefix tokens, at the input
  or fresh before every block (``VisionTransformer.add_prompts``).
- ``adaptformer`` (Chen et al. 2022): a bottleneck MLP beside each block's MLP (``add_adapters``).
- ``bitfit`` (Ben Zaken et al. 2022): the biases alone; ``linear``: the head alone.

An adapter folder is what ``peft`` writes: ``adapter_config.json`` and ``adapter_model.safetensors`` with keys
``base_model.model.<module>.<weight>``. LoRA and DoRA folders are ``peft``'s own format and load in ``peft``;
VPT, AdaptFormer and BitFit, which ``peft`` has no type for, write the same shape with a ``peft_type`` of
vitkit's. The weights file's metadata holds what vitkit changed in the base's config (image size, channels,
head, class names), so that ``load(BASE, adapter=DIR)`` rebuilds the adapted model exactly. Folders written by
``peft`` for timm ViTs (vitkit's module names) and for HF transformers ViTs (transformers 4's and 5's names,
separate q/k/v layers fused into vitkit's rows) are read too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ..atomic import atomic_directory, os_errors
from ..errors import CheckpointError, ConfigError, FormatError, abridged
from ..models.config import ViTConfig
from ..models.vit import VisionTransformer
from ..paths import regular_file
from .files import read_side_file, read_safetensors
from .hf import NAMES as HF_NAMES
from .names import rename

METHODS = ("lora", "dora", "vpt-shallow", "vpt-deep", "adaptformer", "bitfit", "linear")
LORA_METHODS = ("lora", "dora")
DEFAULT_TARGETS = ("qkv", "fc1", "fc2")
# The dense layers of a block a LoRA may target, by their last name; q, k and v are rows of the fused qkv.
LAYER_TARGETS = {"qkv": "attn.qkv", "proj": "attn.proj", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
ROW_TARGETS = ("q", "k", "v")
HEADS = ("head", "head_dist", "dense_head")
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's prefix of every key of an adapter file
# peft_type of the methods peft has no type for.
VITKIT_TYPES = {"vpt-shallow": "VITKIT_VPT", "vpt-deep": "VITKIT_VPT", "adaptformer": "VITKIT_ADAPTFORMER",
                "bitfit": "VITKIT_BITFIT", "linear": "VITKIT_LINEAR"}
METADATA_KEY = "vitkit"  # the weights file's metadata entry with vitkit's changes to the base config
# Config fields a run may change in the base and an adapter carries (the rest must be the base's).
CARRIED = ("image_size", "in_chans", "num_classes", "provenance", "prompt_tokens", "prompt_deep", "adapter_dim",
           "adapter_scale")


@dataclass(frozen=True)
class AdapterSpec:
    """One method and its settings (a recipe's ``peft`` section): LoRA's rank, alpha, dropout and target layers,
    VPT's prompt count, AdaptFormer's width and scale."""

    method: str
    lora_rank: int = 8
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    prompt_tokens: int = 10
    adapter_dim: int = 64
    adapter_scale: float = 0.1

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"peft method {self.method!r}: expected one of {', '.join(METHODS)}")
        unknown = [t for t in self.targets if t not in LAYER_TARGETS and t not in ROW_TARGETS]
        if self.method in LORA_METHODS and (unknown or not self.targets):
            raise ConfigError(f"--peft-targets {','.join(self.targets) or '(none)'}: "
                              f"{'unknown ' + ', '.join(unknown) if unknown else 'none given'}; expected some of "
                              f"{', '.join((*LAYER_TARGETS, *ROW_TARGETS))}")
        if self.method in LORA_METHODS and "qkv" in self.targets and set(ROW_TARGETS) & set(self.targets):
            raise ConfigError(f"--peft-targets {','.join(self.targets)}: qkv already holds the q, k and v rows; give "
                              f"qkv or some of q, k, v")


# ------------------------------------------------------------------------------------------- methods
def adapt(model: VisionTransformer, spec: AdapterSpec) -> tuple[int, int]:
    """``model`` made ready to train with ``spec``'s method: its modules added (LoRA layers, prompts, adapters;
    LoRA's B and AdaptFormer's up-projection start at zero, so those start as the model), then what the method
    trains and the head trainable, the rest frozen. Returns (trainable, all) parameter counts."""
    if spec.method in LORA_METHODS and model.config.clamp_linears:
        raise ConfigError(f"--peft {spec.method} on clamped dense layers (clamp_linears, Gemma 4's E2B/E4B tower): "
                          f"its update would add outside the clamps and merge inside them; train with another "
                          f"method, or unclamped")
    if spec.method in LORA_METHODS:
        _inject(model, _lora_layers(model, spec), dora=spec.method == "dora", dropout=spec.lora_dropout)
    elif spec.method.startswith("vpt"):
        model.add_prompts(spec.prompt_tokens, deep=spec.method == "vpt-deep")
    elif spec.method == "adaptformer":
        model.add_adapters(spec.adapter_dim, spec.adapter_scale)
    model.peft_method = spec.method
    return freeze(model, spec.method)


def freeze(model: nn.Module, method: str) -> tuple[int, int]:
    """Train what ``method`` trains and the head, freeze the rest; returns (trainable, all) parameter counts."""
    for name, param in model.named_parameters():
        param.requires_grad_(is_trained(name, method))
    return parameter_counts(model)


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(trained, all) parameters of ``model``: those that require gradients, and every one."""
    counted = [(p.numel(), p.requires_grad) for p in model.parameters()]
    return sum(n for n, trained in counted if trained), sum(n for n, _ in counted)


def is_trained(name: str, method: str) -> bool:
    """Whether the parameter ``name`` (as ``named_parameters`` spells it) is trained by ``method``."""
    if name.split(".", 1)[0] in HEADS:
        return True
    if method in LORA_METHODS:
        return ".lora_" in name
    if method.startswith("vpt"):
        return name == "prompts"
    if method == "adaptformer":
        return ".adapter." in name
    if method == "bitfit":
        return name.endswith("bias")
    return False


@dataclass(frozen=True)
class LoraLayer:
    """One LoRA of a model: the module it wraps, its rank and alpha, and (a LoRA on some rows of the fused qkv)
    which of the q, k, v parts it updates."""

    module: str
    rank: int
    alpha: float
    rows: tuple[str, ...] = ()


def _lora_layers(model: VisionTransformer, spec: AdapterSpec) -> list[LoraLayer]:
    """The LoRAs of ``spec`` in ``model``'s blocks: one per targeted layer, with the row targets (q, k, v) of a
    block gathered into one LoRA on its qkv, of rank ``r`` per part (alpha alike, so each part's scale is alpha / r)."""
    rows = tuple(t for t in ROW_TARGETS if t in spec.targets)
    layers = []
    for index in range(len(model.blocks)):
        for target in spec.targets:
            if target in LAYER_TARGETS:
                layers.append(LoraLayer(f"blocks.{index}.{LAYER_TARGETS[target]}", spec.lora_rank, spec.lora_alpha))
        if rows:
            layers.append(LoraLayer(f"blocks.{index}.attn.qkv", spec.lora_rank * len(rows),
                                    spec.lora_alpha * len(rows), rows))
    for layer in layers:
        base = model.get_submodule(layer.module)
        if spec.lora_rank > min(base.in_features, base.out_features):
            raise ConfigError(f"--lora-rank {spec.lora_rank}: larger than {layer.module} "
                              f"({base.out_features} x {base.in_features}); expected at most "
                              f"{min(base.in_features, base.out_features)}")
    return layers


def lora_config(layers: list[LoraLayer], dora: bool, dropout: float = 0.0, rslora: bool = False,
                saved: tuple[str, ...] = ()) -> Any:
    """peft's ``LoraConfig`` for ``layers`` (exact module names, each with its own rank and alpha), with the
    modules ``saved`` whole beside them (the head, in the config an adapter folder holds)."""
    from peft import LoraConfig

    first = layers[0]
    pattern = "|".join(sorted({re.escape(layer.module) for layer in layers}))
    return LoraConfig(r=first.rank, lora_alpha=first.alpha, lora_dropout=dropout, use_dora=dora, use_rslora=rslora,
                      target_modules=f"^(?:{pattern})$", modules_to_save=list(saved) or None,
                      rank_pattern={re.escape(layer.module): layer.rank for layer in layers if layer.rank != first.rank},
                      alpha_pattern={re.escape(layer.module): layer.alpha for layer in layers
                                     if layer.alpha != first.alpha})


def _inject(model: VisionTransformer, layers: list[LoraLayer], dora: bool, dropout: float = 0.0,
            rslora: bool = False) -> None:
    """Wrap ``layers`` of ``model`` in peft's LoRA layers (in place: the model stays a ``VisionTransformer``);
    a LoRA on some rows of qkv gets gradient masks that keep its other rows at zero."""
    peft = _require_peft()
    config = lora_config(layers, dora, dropout, rslora)
    model.peft_layers = layers  # what a LoRA-adapted model holds, for saving and merging
    model.peft_dora = dora
    trainable = {id(p): p.requires_grad for p in model.parameters()}
    peft.inject_adapter_in_model(config, model)
    for param in model.parameters():  # peft freezes the rest; what trains is ``freeze``'s to say
        param.requires_grad_(trainable.get(id(param), True))
    for layer in layers:
        if layer.rows:
            _keep_rows(model.get_submodule(layer.module), layer)


def _keep_rows(module: nn.Module, layer: LoraLayer) -> None:
    """Gradient masks that keep a qkv LoRA to its parts' rows: part j's rank-r slice of A feeds only part j's
    rows of B, and DoRA's magnitude of the untouched rows stays that of the weight."""
    out = module.base_layer.out_features
    width, rank = out // 3, layer.rank // len(layer.rows)
    mask = torch.zeros(out, layer.rank)
    rows = torch.zeros(out)
    for slot, part in enumerate(layer.rows):
        start = ROW_TARGETS.index(part) * width
        mask[start:start + width, slot * rank:(slot + 1) * rank] = 1
        rows[start:start + width] = 1
    weight = module.lora_B["default"].weight
    weight.register_hook(lambda grad: grad * mask.to(grad))
    if "default" in getattr(module, "lora_magnitude_vector", {}):
        module.lora_magnitude_vector["default"].weight.register_hook(lambda grad: grad * rows.to(grad))


def _require_peft():
    try:
        import peft
    except ImportError as error:
        raise ImportError("LoRA and DoRA need HF peft: pip install 'vitkit[peft]'") from error
    return peft


def lora_layers(model: nn.Module) -> list[LoraLayer]:
    """The LoRAs ``model`` holds (none unless adapted by LoRA or DoRA)."""
    return getattr(model, "peft_layers", [])


def merged(model: VisionTransformer) -> VisionTransformer:
    """``model`` with every LoRA (and DoRA) merged into the weights it wraps, the wrappers gone: a plain
    ``VisionTransformer`` that every writer and exporter takes, computing what the adapted model computes. A
    model without LoRA is returned as it is."""
    if not lora_layers(model):
        return model
    for layer in lora_layers(model):
        wrapper = model.get_submodule(layer.module)
        with torch.no_grad():
            wrapper.merge()
        parent, _, name = layer.module.rpartition(".")
        setattr(model.get_submodule(parent), name, wrapper.get_base_layer())
    del model.peft_layers, model.peft_dora
    return model


def copy_of(model: VisionTransformer, state: dict[str, torch.Tensor]) -> VisionTransformer:
    """A stand-alone copy of ``model`` (adapted or not) on the CPU holding ``state`` (its whole state dict, as
    gathered from FSDP shards)."""
    with torch.device("meta"):  # nothing drawn that the state replaces
        copy = VisionTransformer(model.config)
        if lora_layers(model):
            _inject(copy, lora_layers(model), model.peft_dora)
    copy.peft_method = getattr(model, "peft_method", None)
    copy.to_empty(device="cpu")
    copy.load_state_dict(state, strict=True)
    return copy


def save_model(model: VisionTransformer, directory: str | Path) -> Path:
    """``model.save`` for an adapted model too: a LoRA-adapted one is saved merged (a copy), as the plain ViT
    every reader takes; prompts and adapters are part of vitkit's model and saved as they are."""
    if lora_layers(model):
        model = merged(copy_of(model, model.state_dict()))
    return model.save(directory)


# -------------------------------------------------------------------------------------------- files
def save_adapter(model: VisionTransformer, directory: str | Path, base: str | None = None) -> Path:
    """Write what ``model``'s method trained (``adapt``) into ``directory`` atomically: ``adapter_config.json``
    and ``adapter_model.safetensors``, peft's format for LoRA and DoRA. ``base`` names the checkpoint adapted."""
    method = getattr(model, "peft_method", None)
    if method is None:
        raise ConfigError("save_adapter: the model was not adapted (vitkit.checkpoints.adapters.adapt)")
    trained = {name: p for name, p in model.named_parameters() if is_trained(name, method)}
    heads = [head for head in HEADS if isinstance(getattr(model, head, None), nn.Linear)]
    if method in LORA_METHODS:
        config = lora_config(lora_layers(model), model.peft_dora, saved=tuple(heads)).to_dict()
        config = {key: sorted(value) if isinstance(value, set) else value for key, value in config.items()}
        weights = {_peft_key(name): p for name, p in trained.items()}
    else:
        config = {"peft_type": VITKIT_TYPES[method], "method": method, "modules_to_save": heads,
                  **{field: getattr(model.config, field) for field in CARRIED[4:]}}
        weights = {PREFIX + name: p for name, p in trained.items()}
    config["base_model_name_or_path"] = base
    carried = model.config.to_dict()
    metadata = {"format": "pt", METADATA_KEY: json.dumps({"method": method,
                                                          "config": {k: carried[k] for k in CARRIED}})}
    with atomic_directory(directory, allowed_existing=(CONFIG_FILE,)) as staging:
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True))
        with os_errors(directory):
            save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, staging / WEIGHTS_FILE,
                      metadata=metadata)
    return Path(directory)


def _peft_key(name: str) -> str:
    """peft's file key of a parameter of an injected model: ``blocks.0.attn.qkv.lora_A.default.weight`` ->
    ``base_model.model.blocks.0.attn.qkv.lora_A.weight`` (DoRA's magnitude loses its ``.weight`` too)."""
    name = name.replace(".default", "")
    if ".lora_magnitude_vector." in name:
        name = name.removesuffix(".weight")
    return PREFIX + name


def is_adapter_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding an adapter's config (as peft and ``finetune --peft`` write them)."""
    return (Path(path) / CONFIG_FILE).is_file()


def base_named(directory: Path) -> str:
    """``; its base: NAME`` where an adapter folder's config names the model it adapted, else nothing."""
    base = (read_side_file(directory / CONFIG_FILE) or {}).get("base_model_name_or_path")
    return f"; its base: {base}" if isinstance(base, str) and base else ""


def load_adapter(model: VisionTransformer, directory: str | Path) -> VisionTransformer:
    """``model`` (a base as ``load`` builds it) adapted by the folder ``directory``: vitkit's own adapters and
    peft's for timm and HF transformers ViTs. Whatever does not fit the base is refused naming the module, the
    key or the shapes; the model is changed only once everything has been checked."""
    directory = Path(directory)
    config, weights, carried = read_adapter(directory)
    source = str(directory / WEIGHTS_FILE)
    peft_type = config.get("peft_type")
    heads = _heads(weights, peft_type == "LORA", source)
    _apply_carried(model, carried, heads, source)
    if peft_type == "LORA":
        layers, state = _lora_state(model, config, weights, source)
        dora = bool(config.get("use_dora"))
        _inject(model, layers, dora=dora, rslora=bool(config.get("use_rslora")))
        model.peft_method = "dora" if dora else "lora"
        _set_lora_state(model, state, source)
    elif peft_type in set(VITKIT_TYPES.values()):
        method = config.get("method")
        if VITKIT_TYPES.get(method) != peft_type:
            raise CheckpointError(f"{directory / CONFIG_FILE}: method={abridged(method)} for peft_type {peft_type}; "
                                  f"expected one of {[m for m, t in VITKIT_TYPES.items() if t == peft_type]}")
        if method.startswith("vpt"):
            model.add_prompts(_count(config, "prompt_tokens", directory), deep=method == "vpt-deep")
        elif method == "adaptformer":
            model.add_adapters(_count(config, "adapter_dim", directory), _number(config, "adapter_scale", directory))
        model.peft_method = method
        _set_state(model, weights, method, source)
    else:
        raise CheckpointError(f"{directory / CONFIG_FILE}: peft_type={abridged(peft_type)}; vitkit reads LORA "
                              f"(LoRA and DoRA) and its own {', '.join(sorted(set(VITKIT_TYPES.values())))}")
    _set_heads(model, heads, source)
    return model.eval()


def read_adapter(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """An adapter folder's config, its weights (keys without peft's prefix) and the config fields vitkit carried
    (empty for a folder that peft wrote)."""
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not directory.is_dir():
        raise CheckpointError(f"no adapter folder at {directory}")
    config = read_side_file(config_path)
    if config is None:
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}; expected an adapter folder ({CONFIG_FILE} + "
                              f"{WEIGHTS_FILE}, as peft and vitkit finetune --peft write them)")
    if not weights_path.exists():
        raise CheckpointError(f"{directory}: no {WEIGHTS_FILE} beside {CONFIG_FILE}")
    weights = read_safetensors(weights_path)
    carried: dict[str, Any] = {}
    try:
        regular_file(weights_path)
        with safe_open(str(weights_path), "pt") as handle:
            text = (handle.metadata() or {}).get(METADATA_KEY)
        if text is not None:
            carried = json.loads(text)["config"]
            if not isinstance(carried, dict) or set(carried) - set(CARRIED):
                raise ValueError(f"fields {sorted(carried)}")
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise CheckpointError(f"{weights_path}: unreadable vitkit metadata ({error})") from error
    return config, {key.removeprefix(PREFIX): value for key, value in weights.items()}, carried


def _count(config: dict[str, Any], key: str, directory: Path) -> int:
    value = config.get(key)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise CheckpointError(f"{directory / CONFIG_FILE}: {key}={abridged(value)}; expected an int >= 1")
    return value


def _number(config: dict[str, Any], key: str, directory: Path) -> float:
    value = config.get(key)
    if not (isinstance(value, int | float) and not isinstance(value, bool)):
        raise CheckpointError(f"{directory / CONFIG_FILE}: {key}={abridged(value)}; expected a number")
    return float(value)


def _apply_carried(model: VisionTransformer, carried: dict[str, Any], heads: dict[str, torch.Tensor],
                   source: str) -> None:
    """The base brought to the adapted model's input and head: vitkit's carried fields (channels, image size,
    classes), or for a peft folder the head's shape."""
    try:
        fields = ViTConfig.from_dict({**model.config.to_dict(), **carried}, source)
    except ConfigError as error:
        raise CheckpointError(str(error)) from None
    if fields.in_chans != model.config.in_chans:
        model.map_channels(fields.in_chans)
    if fields.image_size != model.config.image_size:
        model.resize_image(fields.image_size)
    classes = fields.num_classes if carried else (heads["head.weight"].shape[0] if "head.weight" in heads
                                                  else model.config.num_classes)
    if classes != model.config.num_classes:
        model.reset_head(classes, keep_pre_logits=True)
    if carried:
        model.config = model.config.replace(provenance=fields.provenance)


def _heads(weights: dict[str, torch.Tensor], lora: bool, source: str) -> dict[str, torch.Tensor]:
    """The head weights saved whole beside the adapter (peft's ``modules_to_save``), taken out of ``weights``, in
    vitkit's names: ``head`` (timm's and vitkit's) or, beside a LoRA, HF's ``classifier``."""
    if not lora:
        return {key: weights.pop(key) for key in list(weights) if key.split(".", 1)[0] in HEADS}
    heads = {}
    for key in [key for key in weights if LORA_KEY.match(key) is None]:
        name = key if key.split(".", 1)[0] in HEADS else _hf_name(key, source)
        if name.split(".", 1)[0] not in HEADS:
            raise CheckpointError(f"{source}: {key} is saved whole beside the adapter; vitkit takes the head "
                                  f"(head, HF's classifier) and LoRA weights, nothing else of the base")
        heads[name] = weights.pop(key)
    return heads


def _set_heads(model: VisionTransformer, heads: dict[str, torch.Tensor], source: str) -> None:
    expected = {f"{head}.{key}": value for head in HEADS if isinstance(getattr(model, head, None), nn.Linear)
                for key, value in getattr(model, head).state_dict().items()}
    _check_shapes(heads, expected, source)
    with torch.no_grad():
        for key, value in heads.items():
            head, name = key.split(".", 1)
            getattr(getattr(model, head), name).copy_(value)


def _check_shapes(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], source: str) -> None:
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(f"{source}: {', '.join(unexpected[:6])}{' ...' if len(unexpected) > 6 else ''} match "
                              f"nothing in the base model")
    for key, value in found.items():
        if value.shape != expected[key].shape:
            raise CheckpointError(f"{source}: {key} is {tuple(value.shape)}, the base model's is "
                                  f"{tuple(expected[key].shape)}; the adapter was trained for another base")


def _set_state(model: VisionTransformer, weights: dict[str, torch.Tensor], method: str, source: str) -> None:
    """Load a vitkit adapter's trained tensors (all of them, nothing else) into ``model``."""
    params = dict(model.named_parameters())
    expected = {name: p for name, p in params.items() if is_trained(name, method) and name.split(".")[0] not in HEADS}
    _check_shapes(weights, expected, source)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise CheckpointError(f"{source}: no {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}; expected "
                              f"every tensor a {method} adapter trains")
    with torch.no_grad():
        for key, value in weights.items():
            params[key].copy_(value)


# -------------------------------------------------------------------------------- LoRA from every naming
LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_magnitude_vector|lora_embedding_A|"
                      r"lora_embedding_B)(?P<rest>(\.weight)?)$")


def _lora_state(model: VisionTransformer, config: dict[str, Any], weights: dict[str, torch.Tensor], source: str
                ) -> tuple[list[LoraLayer], dict[str, torch.Tensor]]:
    """The LoRAs of a peft LoRA folder in vitkit's names: the file's own names where they are vitkit's (timm
    ViTs), else HF transformers' (4.x ``attention.attention.query``, 5.x ``attention.q_proj``), with separate q,
    k, v LoRAs fused into one LoRA on vitkit's qkv. Each LoRA's scale (alpha / r, or alpha / sqrt(r) with
    rsLoRA) is folded into its B, so every fused LoRA has scale 1."""
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in weights.items():
        found = LORA_KEY.match(key)
        if found is None or found["part"].startswith("lora_embedding"):
            raise CheckpointError(f"{source}: {key} is not a LoRA weight of a linear layer (lora_A, lora_B, "
                                  f"lora_magnitude_vector) nor a head")
        by_module.setdefault(found["module"], {})[found["part"]] = value
    modules = dict(model.named_modules())
    named = {name if name in modules else _hf_name(f"{name}.weight", source).removesuffix(".weight"): parts
             for name, parts in by_module.items()}
    rslora = bool(config.get("use_rslora"))
    fused: dict[str, list[tuple[str, dict[str, torch.Tensor]]]] = {}
    for name, parts in named.items():
        module, _, part = name.rpartition(".") if name.endswith((".attn.q", ".attn.k", ".attn.v")) else (name, "", "")
        target = f"{module}.qkv" if part else name
        base = modules.get(target)
        if not isinstance(base, nn.Linear):
            raise CheckpointError(f"{source}: target module {name} matches no linear layer of the base model")
        if not {"lora_A", "lora_B"} <= parts.keys():
            raise CheckpointError(f"{source}: {name} has {sorted(parts)}; expected lora_A and lora_B")
        fused.setdefault(target, []).append((part, parts))
    layers, state = [], {}
    for target, pieces in sorted(fused.items()):
        base = modules[target]
        width = base.out_features // 3 if pieces[0][0] else base.out_features
        a_parts, b_parts, magnitude = [], [], None
        for part, parts in sorted(pieces, key=lambda piece: ROW_TARGETS.index(piece[0]) if piece[0] else 0):
            a, b = parts["lora_A"], parts["lora_B"]
            rank = a.shape[0]
            if a.ndim != 2 or b.ndim != 2 or b.shape[1] != rank or a.shape[1] != base.in_features \
                    or b.shape[0] != width:
                raise CheckpointError(f"{source}: the LoRA of {target}{'.' + part if part else ''} is A {tuple(a.shape)}"
                                      f", B {tuple(b.shape)}; the base's layer takes {base.in_features} and gives "
                                      f"{width} features: the adapter was trained for another base")
            scale = _scale(config, target if not part else f"{target.rpartition('.')[0]}.{part}", rank, rslora)
            a_parts.append(a)
            b_parts.append((part, b * scale))
            if "lora_magnitude_vector" in parts:
                magnitude = magnitude if magnitude is not None else _row_norms(base)
                rows = slice(ROW_TARGETS.index(part) * width, (ROW_TARGETS.index(part) + 1) * width) if part \
                    else slice(None)
                magnitude[rows] = parts["lora_magnitude_vector"].reshape(-1)
        a = torch.cat(a_parts)
        b = torch.zeros(base.out_features, a.shape[0], dtype=b_parts[0][1].dtype)
        column = 0
        for part, piece in b_parts:
            rows = slice(ROW_TARGETS.index(part) * width, (ROW_TARGETS.index(part) + 1) * width) if part else slice(None)
            b[rows, column:column + piece.shape[1]] = piece
            column += piece.shape[1]
        rank = a.shape[0]
        layers.append(LoraLayer(target, rank, rank ** 0.5 if rslora else float(rank),
                                tuple(part for part, _ in b_parts if part)))
        state[f"{target}.lora_A.weight"], state[f"{target}.lora_B.weight"] = a, b
        if magnitude is not None:
            state[f"{target}.lora_magnitude_vector"] = magnitude
    if not layers:
        raise CheckpointError(f"{source}: holds no LoRA weights")
    return layers, state


def _scale(config: dict[str, Any], name: str, rank: int, rslora: bool) -> float:
    """peft's scale of the LoRA on module ``name`` (in the file's names): its alpha (alpha_pattern, else
    lora_alpha) over its rank, or over the rank's root with rsLoRA."""
    alpha = config.get("lora_alpha", 8)
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", name):
            alpha = value
            break
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise CheckpointError(f"{CONFIG_FILE}: lora_alpha={abridged(alpha)}; expected a number")
    return alpha / (rank ** 0.5 if rslora else rank)


def _row_norms(base: nn.Linear) -> torch.Tensor:
    """DoRA's magnitude of rows a LoRA leaves alone: the norm of each row of the weight."""
    return base.weight.detach().float().norm(dim=1)


def _hf_name(key: str, source: str) -> str:
    """vitkit's name of the HF transformers ViT weight ``key`` (4.x or 5.x names, with or without the model's
    ``vit.``, ``deit.`` or ``dinov2.`` prefix; the query, key and value layers as ``attn.q``, ``attn.k``,
    ``attn.v``)."""
    try:
        return next(iter(rename({re.sub(r"^(vit|deit|dinov2)\.", "", key): None}, HF_NAMES, source)))
    except CheckpointError:
        raise CheckpointError(f"{source}: target module {key.removesuffix('.weight')} matches no module of the base "
                              f"model (in vitkit's, timm's or HF transformers' ViT names)") from None


def _set_lora_state(model: VisionTransformer, state: dict[str, torch.Tensor], source: str) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    missing = [key for key in result.missing_keys if ".lora_" in key]
    if result.unexpected_keys or missing:
        raise CheckpointError(f"{source}: LoRA weights that do not fit the base: unexpected "
                              f"{result.unexpected_keys[:6]}, missing {missing[:6]}")


def refuse_adapted(config: ViTConfig, target: str) -> None:
    """Formats whose models have no prompts or adapters refuse an adapted model, naming what it holds."""
    held = [name for name, value in (("VPT prompts (prompt_tokens)", config.prompt_tokens),
                                     ("AdaptFormer adapters (adapter_dim)", config.adapter_dim)) if value]
    if held:
        raise FormatError(f"{target} has no place for {' and '.join(held)}; write vitkit's format or ONNX/OpenVINO, "
                          f"or keep the adapter folder beside its base")
