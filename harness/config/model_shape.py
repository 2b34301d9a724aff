"""A model's tensor shapes read from transformers' own model built on the meta device, cached as JSON.

The planner (harness/plan) never imports torch: it reads the JSON this module writes. The JSON is keyed
by a hash of the config fields and the transformers version, so `harness plan` builds each model once.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import importlib.metadata
import json
import os
import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Deque, Dict, List, Mapping, Optional, Tuple

from harness.rundir import write_text

SHAPE_VERSION = 20  # bump when the JSON below changes meaning
_MEMO: Dict[str, Dict[str, Any]] = {}
# The last few configs asked for, with their shapes: a search asks for the same one over and over.
_RECENT: Deque[Tuple[Dict[str, Any], Dict[str, Any]]] = collections.deque(maxlen=8)

# What transformers lacks: families without a `base_model_tp_plan`, written in its own style names.
HARNESS_TP_PLANS: Dict[str, Dict[str, str]] = {
    "gpt2": {"h.*.attn.c_attn": "colwise", "h.*.attn.c_proj": "rowwise",
             "h.*.mlp.c_fc": "colwise", "h.*.mlp.c_proj": "rowwise"},
}
# Hyper-connection modules outside the decoder layers: the collapse of the residual streams into one before the
# final norm (DeepSeek-V4 / HY-V4 `hc_head`, Qwen4's `hyper_connection_mixer`).
HYPER_CONNECTION_OUTSIDE = re.compile(r"(^|\.)(hc_head|hyper_connection[^.]*)\.")
# Config keys that hold the number of routed experts a token visits, across families.
_EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k",
                           "experts_per_token", "num_selected_experts", "top_k_experts")
# Parameters outside the decoder layers that the first stage runs on the token embeddings, besides the tables:
# Gemma 4's and Gemma 3n's per-layer-input projection (hidden -> layers x per-layer dim) and its norm, Gemma 3n's
# AltUp projections of the embedding into its extra streams.
_INPUT_SIDE = re.compile(r"(^|\.)(per_layer_(model_projection|projection_norm)|altup_projections\.\d+)\.")
# Encoders of other modalities inside a causal LM (Phi-4-multimodal's image and audio embedders): a text-only
# forward never runs them; they are held by the first stage, idle (no FLOPs, no gradient).
OTHER_MODALITY = re.compile(r"(^|\.)embed_tokens_extend\.")
# Matrices outside the decoder layers that the last stage runs before the final norm: Gemma 3n's AltUp
# projections of the extra streams back (each token multiplies them once, like a weight).
_OUTPUT_SIDE = re.compile(r"(^|\.)altup_unembed_projections\.\d+\.")


def cache_dir() -> Path:
    """$HARNESS_MODEL_CACHE, else ~/.cache/harness/model_shapes (an empty variable counts as unset: it must not
    turn the working directory into the cache)."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "harness" / "model_shapes"
    return Path(os.environ.get("HARNESS_MODEL_CACHE") or default)


def shape_key(hf_config: Mapping[str, Any]) -> str:
    """The cache key: config fields, transformers' version, and this module's version and source (two checkouts
    sharing the cache directory with the same SHAPE_VERSION and different code never read each other's JSON).
    The version is read from the installed package's metadata: importing transformers costs a second of CPU in
    every command that finds its shape cached."""
    payload = json.dumps({"fields": dict(hf_config), "transformers": _transformers_version(),
                          "version": SHAPE_VERSION, "source": _SOURCE_HASH}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _transformers_version() -> str:
    """Read once a process: parsing the package's METADATA file took 90% of a recommender search that asks for
    model shapes tens of thousands of times (`harness recommend engine=nd` on 64 GPUs: 27 s)."""
    return importlib.metadata.version("transformers")


_SOURCE_HASH = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def model_shape(hf_config: Mapping[str, Any]) -> Dict[str, Any]:
    """The shape JSON of these config fields: from memory (by the fields themselves, then by their key), from
    the cache file, or built on meta. A search asks for the same few configs tens of thousands of times: comparing
    the fields costs less than hashing them into the key."""
    for fields, known in _RECENT:
        if fields == hf_config:
            return known
    key = shape_key(hf_config)
    if key in _MEMO:
        _RECENT.append((dict(hf_config), _MEMO[key]))
        return _MEMO[key]
    path = cache_dir() / f"{key}.json"
    try:
        shape = json.loads(path.read_text())
    except (OSError, ValueError):
        shape = derive_shape(hf_config)
        write_text(path, json.dumps(shape))
    _MEMO[key] = shape
    _RECENT.append((dict(hf_config), shape))
    return shape


def hf_config_object(fields: Mapping[str, Any]):
    """transformers' config object for `model_type` plus fields (SDPA attention unless told otherwise,
    or unless the family's model cannot run it)."""
    from transformers import AutoConfig

    fields = dict(fields)
    model_type = fields.pop("model_type", None)
    # SDPA by default: it keeps attention causal without a mask in every layout (eager without a
    # mask is not). The planner reads the same field for its activation model.
    attn_implementation = fields.pop("attn_implementation", None) or default_attention(model_type)
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"model.hf_config.model_type={model_type!r} is not a transformers model type "
                         f"(transformers {transformers.__version__})")
    try:
        return AutoConfig.for_model(model_type, attn_implementation=attn_implementation, **fields)
    except Exception as error:  # the config class's own validation (strict dataclass validators included)
        cause = error.__cause__ or error
        raise ValueError(f"model.hf_config ({model_type}): transformers rejects these fields: "
                         f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0]}") from None


def default_attention(model_type: Any) -> str:
    """"sdpa" where the family's causal LM supports it; else "eager" (Gemma 2's soft-capped scores)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    model_class = getattr(transformers, name, None) if name else None
    return "eager" if model_class is not None and not getattr(model_class, "_supports_sdpa", True) else "sdpa"


def derive_shape(hf_config: Mapping[str, Any]) -> Dict[str, Any]:
    """Build the causal LM on the meta device and record every parameter tensor, layer by layer."""
    config = hf_config_object(hf_config)
    model_type = config.model_type
    model = _meta_causal_lm(config)
    config = _decoder_config(config)
    if recurrent_runs(config) is not None:  # HRM: two weight-shared stacks, each layer run several times
        layers_names, layers, layer_runs = _recurrent_stacks(model, config)
    else:
        layers_name, layers = _decoder_layers(model, config)
        layers_names, layer_runs = (layers_name,), None
    _refuse_tables_in_layers(model_type, layers)
    try:
        fields = _fields(config)
    except Exception as error:  # e.g. head_dim differing between layers (Gemma 4)
        raise ValueError(f"model.hf_config ({model_type}): per-layer shapes are not supported "
                         f"({str(error).splitlines()[0][:120]})") from None
    fields["num_layers"] = len(layers)  # the declared layers (LongCat-Flash's num_hidden_layers counts halves)
    tp_plan, tp_source = _tp_plan(config)
    kinds, pattern = _layer_kinds([_layer_tensors(layer, tp_plan) for layer in layers])
    first, inputs, last, tied = _outside_tensors(model, layers_names, _outside_tp_plan(config))
    shape = {
        "version": SHAPE_VERSION,
        "model_type": model_type,
        "architecture": type(model).__name__,
        "fields": fields,
        "experts_per_token": _experts_per_token(config),
        "tp_plan": tp_plan,
        "tp_plan_source": tp_source,
        "layer_kinds": kinds,
        "layer_pattern": pattern,
        "first": first,
        "inputs": inputs,
        "last": last,
        "tied_embeddings": tied,
        "total_params": sum(p.numel() for p in model.parameters()),
        "no_split_modules": list(getattr(model, "_no_split_modules", None) or []),
        "decoder_layer": decoder_layer_name(model),
        "pp_plan": sorted(getattr(config, "base_model_pp_plan", None) or {}),
        # parameters outside the layers that never get a gradient (HRM's z_L_init, the L stack's initial state)
        "frozen": [name for name, p in model.named_parameters() if not p.requires_grad
                   and not name.startswith(tuple(n + "." for n in layers_names))],
    }
    if layer_runs is not None:
        shape["layer_runs"] = layer_runs
    return shape


def recurrent_runs(config: Any) -> Optional[Tuple[List[int], List[int]]]:
    """HRM (hrm_text, HrmTextModel.forward): per stack, (runs with gradient, runs under no_grad) of each of its
    layers in one forward, or None for a family whose layers run once each.

    The L stack runs L_cycles times in each of H_cycles cycles, the H stack once per cycle (num_hidden_layers,
    num_layers_per_stack x H_cycles x (L_cycles + 1), counts these runs, not layers). L_bp_cycles, left-padded with
    1s to H_cycles entries, gives g_c, the trailing L runs of cycle c that keep their gradient: the loop runs
    L run l with gradient when l >= L_cycles - g_c, i.e. clamp(g_c, 0, L_cycles) of them (a cycle past the
    padded list keeps 1). So the L stack's layers run sum_c clamp(g_c, 0, L_cycles) times with gradient and
    H_cycles·L_cycles minus that under no_grad; the H stack's run H_cycles times, all with gradient."""
    h_cycles, l_cycles = getattr(config, "H_cycles", None), getattr(config, "L_cycles", None)
    if not (h_cycles and l_cycles):
        return None
    backprop = list(getattr(config, "L_bp_cycles", None) or [])
    backprop = [1] * max(0, h_cycles - len(backprop)) + backprop  # HrmTextModel's left padding
    grad = sum(min(l_cycles, max(0, backprop[c] if c < len(backprop) else 1)) for c in range(h_cycles))
    if not grad:
        raise ValueError(f"model.hf_config ({config.model_type}): L_bp_cycles={config.L_bp_cycles} runs every one of "
                         f"the L stack's {h_cycles * l_cycles} runs under no_grad: its layers never get a gradient "
                         "(the planner trains every decoder layer)")
    return [grad, h_cycles * l_cycles - grad], [h_cycles, 0]


def _recurrent_stacks(model: Any, config: Any) -> Tuple[Tuple[str, ...], List[Any], List[List[int]]]:
    """HRM's two weight-shared stacks (L_module, then H_module): their layer lists' names, their distinct layers
    (each stack's num_layers_per_stack, held once) and each layer's [runs with gradient, runs under no_grad]."""
    import torch

    runs = recurrent_runs(config)
    assert runs is not None
    lists = dict((name, module) for name, module in model.named_modules() if isinstance(module, torch.nn.ModuleList))
    names, layers, layer_runs = [], [], []
    for stack, stack_runs in zip(("L_module", "H_module"), runs):
        found = [name for name in lists if name.endswith(f"{stack}.layers")]
        if len(found) != 1 or len(lists[found[0]]) != int(config.num_layers_per_stack):
            raise ValueError(f"{type(model).__name__}: no {stack}.layers list of num_layers_per_stack="
                             f"{config.num_layers_per_stack} decoder layers")
        names.append(found[0])
        layers += list(lists[found[0]])
        layer_runs += [list(stack_runs)] * len(lists[found[0]])
    return tuple(names), layers, layer_runs


def decoder_layer_name(model: Any) -> Optional[str]:
    """The repeated block FSDP wraps and checkpoints, read from the model instead of hard-coded: the first module
    whose class the model names in `_no_split_modules` (transformers' unit never split across devices); None
    where it names none."""
    names = getattr(model, "_no_split_modules", None) or []
    return next((type(module).__name__ for module in model.modules() if type(module).__name__ in names), None)


def wrapped_layer(shape: Mapping[str, Any]) -> str:
    """The shape's decoder layer class name, or why FSDP has none to wrap."""
    if shape["decoder_layer"] is None:
        raise ValueError(f"{shape['architecture']} declares no decoder layer class in "
                         f"_no_split_modules={shape['no_split_modules']}")
    return shape["decoder_layer"]


def _meta_causal_lm(config: Any) -> Any:
    """The decoder-only causal LM AutoModelForCausalLM builds from the config, on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    model_type = config.model_type
    # Encoders (BERT, RoBERTa ...) also have a causal-LM head class: their masked-LM class gives them away.
    if (model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
            or getattr(config, "is_encoder_decoder", False)):
        raise ValueError(f"model.hf_config.model_type={model_type!r} is not a decoder-only causal LM "
                         "(the planner models decoder-only transformers built by AutoModelForCausalLM)")
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as error:  # a config transformers itself rejects
        raise ValueError(f"model.hf_config ({model_type}): transformers cannot build the model: "
                         f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None


def _layer_kinds(layer_rows: List[List[Any]]) -> Tuple[List[List[Any]], List[int]]:
    """The distinct layers' tensor rows, and each layer's index among them."""
    kinds: List[List[Any]] = []
    pattern = []
    for rows in layer_rows:
        if rows not in kinds:
            kinds.append(rows)
        pattern.append(kinds.index(rows))
    return kinds, pattern


def _decoder_config(config: Any) -> Any:
    """The config of the decoder AutoModelForCausalLM builds: the config itself, or, for a composite (multimodal)
    config whose causal LM is its text decoder alone (Llama 4's Llama4ForCausalLM), its text config."""
    text = config.get_text_config()
    if text is not config and getattr(config, "num_hidden_layers", None) is not None:  # fields beside text_config
        raise ValueError(f"model.hf_config.model_type={config.model_type!r} is a composite (multimodal) config: its "
                         "causal LM is built from text_config; give the decoder's fields (num_hidden_layers ...) "
                         "under model.hf_config.text_config")
    if getattr(text, "num_hidden_layers", None) is None:
        raise ValueError(f"model.hf_config.model_type={config.model_type!r} is a composite (multimodal) config "
                         "without a text decoder config; give the model type of its text decoder")
    return text


def _decoder_layers(model: Any, config: Any) -> Tuple[str, List[Any]]:
    """The ModuleList of num_hidden_layers decoder layers, or of the config's declared num_layers where
    num_hidden_layers counts sub-layers (LongCat-Flash: 2 x num_layers, two attention + MLP halves a layer)."""
    import torch

    count = int(config.num_hidden_layers)
    declared = getattr(config, "num_layers", None)
    counts = [count] + ([declared] if isinstance(declared, int) and 0 < declared < count and not count % declared
                        else [])
    for n in counts:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.ModuleList) and len(module) == n and n:
                return name, list(module)
    raise ValueError(f"{type(model).__name__}: no list of {count} decoder layers (num_hidden_layers): "
                     "the planner models a stack of repeated decoder layers")


def _refuse_tables_in_layers(model_type: str, layers: List[Any]) -> None:
    """An embedding table inside a decoder layer (Qwen4's per-layer n-gram embeddings, `ple_layer_ids`) is a
    lookup, not a weight every token multiplies: the per-layer counts would price it as one."""
    import torch

    for index, layer in enumerate(layers):
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Embedding):
                raise ValueError(f"model.hf_config ({model_type}): layer {index} holds an embedding table "
                                 f"({name}); the planner models embedding tables outside the decoder layers only")


def _tp_plan(config: Any) -> Tuple[Dict[str, str], str]:
    """The per-layer TP styles, keyed by the path inside one layer ("self_attn.q_proj")."""
    plan = getattr(config, "base_model_tp_plan", None) or {}
    source = "transformers" if plan else ("harness" if config.model_type in HARNESS_TP_PLANS else "none")
    plan = plan or HARNESS_TP_PLANS.get(config.model_type, {})
    return {key.split("*.", 1)[1]: style for key, style in plan.items() if "*." in key}, source


def _outside_tp_plan(config: Any) -> Dict[str, str]:
    """The TP styles of modules outside the decoder layers (Qwen4's hyper_connection_mixer), keyed by path."""
    plan = getattr(config, "base_model_tp_plan", None) or {}
    return {key: style for key, style in plan.items() if "*" not in key}


def _tp_dim(style: Optional[str], ndim: int, conv1d: bool) -> Optional[int]:
    """Which dim a TP style splits: colwise styles the output features, rowwise ones the input
    features (a rowwise bias stays whole). nn.Linear stores (out, in), GPT-2's Conv1D (in, out)."""
    if not style:
        return None
    out_dim, in_dim = (ndim - 1, ndim - 2) if conv1d else (ndim - 2, ndim - 1)
    if ndim == 1:
        return 0 if "colwise" in style else None
    if "colwise" in style:
        return out_dim
    if "rowwise" in style:
        return in_dim
    return None


def _style_for(plan: Dict[str, str], param_name: str) -> Optional[str]:
    module_path = param_name.rsplit(".", 1)[0]
    for path in (param_name, module_path):
        for pattern, style in plan.items():
            if fnmatchcase(path, pattern):
                return style
    return None


def _layer_tensors(layer: Any, plan: Dict[str, str]) -> List[List[Any]]:
    """[name, shape, tp_dim, routed-expert, linear] per parameter in module order; the experts of a
    ModuleList are stacked into one (E, ...) tensor, as transformers' fused experts are stored. `linear`: the
    weight of an nn.Linear module, what torchao's float8 training converts (it swaps nn.Linear only: not
    GPT-2's Conv1D, nor the grouped expert tensors of transformers' MoE layers)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    modules = dict(layer.named_modules())
    rows: List[List[Any]] = []
    stacked: Dict[str, List[Any]] = {}
    for name, param in layer.named_parameters():
        parts = name.split(".")
        module = modules.get(".".join(parts[:-1]))
        style = _style_for(plan, name)
        shape = list(param.shape)
        tp_dim = _tp_dim(style, len(shape), isinstance(module, Conv1D))
        linear = isinstance(module, torch.nn.Linear) and parts[-1] == "weight"
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            key = ".".join(parts[:i + 1] + ["*"] + parts[i + 2:])
            if key in stacked:
                stacked[key][1][0] += 1
                continue
            row = [key, [1] + shape, None if tp_dim is None else tp_dim + 1, True, linear]
            stacked[key] = row
        else:
            row = [name, shape, tp_dim, "experts" in parts and len(shape) >= 2, linear]
        rows.append(row)
    return rows


def _outside_tensors(model: Any, layers_names: Tuple[str, ...], plan: Dict[str, str]
                     ) -> Tuple[List[List[Any]], List[List[Any]], List[List[Any]], bool]:
    """Parameters outside the decoder layers: embedding tables first (vocab-split token table), then what the
    first stage runs on the embeddings (an embedding module's own norm, _INPUT_SIDE) or holds idle (OTHER_MODALITY),
    the rest (final norm, an
    untied lm_head, _OUTPUT_SIDE, the hyper-connection collapse of the residual streams) last. A
    hyper-connection tensor is split as the family's TP plan names its module (else replicated)."""
    import torch

    modules = dict(model.named_modules())
    embeddings = {id(m.weight) for m in modules.values() if isinstance(m, torch.nn.Embedding)}
    inside_embedding = tuple(name + "." for name, m in modules.items() if name and isinstance(m, torch.nn.Embedding))
    token_table = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is token_table
    layers_name = layers_names[0]
    prefix = (layers_name.rsplit(".", 1)[0] + ".") if "." in layers_name else ""
    first: List[List[Any]] = []
    inputs: List[List[Any]] = []
    last: List[List[Any]] = []
    for name, param in model.named_parameters():  # tied tables are listed once
        if name.startswith(tuple(n + "." for n in layers_names)):
            continue
        vocab_split = param is token_table or (head is not None and param is head.weight)
        idle = bool(OTHER_MODALITY.search(name))  # its tables too: no token of a text forward reads them
        input_side = idle or (id(param) not in embeddings
                              and bool(name.startswith(inside_embedding) or _INPUT_SIDE.search(name)))
        hyper = bool(HYPER_CONNECTION_OUTSIDE.search(name))
        known = input_side or hyper or _OUTPUT_SIDE.search(name)
        if id(param) not in embeddings and not vocab_split and not known and param.dim() > 1:
            raise ValueError(f"{type(model).__name__}: {name} is a matrix outside the decoder layers (an encoder "
                             "of another modality?); the planner models embeddings, decoder layers, norm, "
                             "hyper-connections and head")
        tp_dim = 0 if vocab_split else None
        if hyper:
            inner = name[len(prefix):] if name.startswith(prefix) else name
            tp_dim = _tp_dim(_style_for(plan, inner), param.dim(), False)
        row = [name, list(param.shape), tp_dim, False]
        (inputs if input_side else first if id(param) in embeddings else last).append(row)
    return first, inputs, last, tied


def _first_attr(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _layer_attention(config: Any) -> List[List[int]]:
    """Per layer: [heads, kv heads, head dim]. A heterogeneous config's own per-layer values (transformers'
    per_layer_config: Gemma 4's global layers have wider heads, and fewer kv heads with attention_k_eq_v); a
    sliding layer's swa_* fields where the config has them (Inkling's hybrid_sliding layers); else the config's."""
    heterogeneous = bool(getattr(config, "is_heterogeneous", False))
    types = list(getattr(config, "layer_types", None) or [])
    rows = []
    for i in range(int(config.num_hidden_layers)):
        layer = config.per_layer_config[i] if heterogeneous else config
        heads = int(layer.num_attention_heads)
        row = [heads, int(_first_attr(layer, "num_key_value_heads", default=heads)),
               int(_first_attr(layer, "head_dim", default=0) or int(layer.hidden_size) // heads)]
        if i < len(types) and "sliding" in str(types[i]) and getattr(layer, "swa_head_dim", None) is not None:
            row = [int(layer.swa_num_attention_heads), int(layer.swa_num_key_value_heads), int(layer.swa_head_dim)]
        rows.append(row)
    return rows


def _fields(config: Any) -> Dict[str, Any]:
    """The config fields the planner reads, under one name each (transformers' resolved defaults); the
    scalars of a heterogeneous config from its most common layer, the attention shape also per layer."""
    per_layer = _layer_attention(config)
    common = max(per_layer, key=lambda row: (per_layer.count(row), -per_layer.index(row)))
    if getattr(config, "is_heterogeneous", False):
        config = config.per_layer_config[per_layer.index(common)]
    hidden = int(config.hidden_size)
    heads, kv_heads, head_dim = common
    layer_types = getattr(config, "layer_types", None)
    return {
        "num_layers": int(config.num_hidden_layers),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "layer_attention": per_layer,
        "qk_head_dim": _qk_head_dim(config, head_dim),
        "v_head_dim": int(_first_attr(config, "v_head_dim", default=head_dim)),
        "ffn_size": _one_size(_first_attr(config, "moe_intermediate_size", "intermediate_size", "n_inner",
                                          "ffn_hidden_size", default=4 * hidden)),
        "dense_ffn_size": _one_size(_first_attr(config, "intermediate_size", "n_inner", default=4 * hidden)),
        "vocab_size": int(config.vocab_size),
        "max_positions": int(_first_attr(config, "max_position_embeddings", "n_positions", default=0)),
        "activation": str(_first_attr(config, "hidden_act", "activation_function", "hidden_activation",
                                      default="")),
        "attention_dropout": float(_first_attr(config, "attention_dropout", "attn_pdrop", default=0.0)),
        "hidden_dropout": float(_first_attr(config, "resid_pdrop", "hidden_dropout", default=0.0)),
        "embedding_dropout": float(_first_attr(config, "embd_pdrop", "embedding_dropout", default=0.0)),
        "sliding_window": _first_attr(config, "sliding_window"),
        "attention_chunk_size": _first_attr(config, "attention_chunk_size"),
        # Sparse attention's indexer: DeepSeek Sparse Attention's top-k keys, or Qwen4's QSA token budget
        "index_topk": _first_attr(config, "index_topk", "indexer_budget"),
        "index_n_heads": _first_attr(config, "index_n_heads", "indexer_n_heads"),
        "index_head_dim": _first_attr(config, "index_head_dim", "indexer_head_dim"),
        "index_block": _first_attr(config, "indexer_compress_ratio"),  # QSA: keys pooled in blocks of c
        "hyper_streams": _first_attr(config, "hc_mult", "hc_count"),  # hyper-connections' residual streams
        "hyper_sinkhorn_iters": _first_attr(config, "hc_sinkhorn_iters"),  # DeepSeek-V4's comb normalisation
        "layer_types": list(layer_types) if layer_types else None,
        # Gated DeltaNet layers (qwen3_next, qwen3_5, olmo_hybrid): value heads, key and value head dims; Kimi delta
        # attention (kimi_linear, bailing_hybrid): its heads, one head dim for keys and values
        "linear_value_heads": _first_attr(config, "linear_num_value_heads", "linear_num_heads"),
        "linear_key_head_dim": _first_attr(config, "linear_key_head_dim", "linear_head_dim"),
        "linear_value_head_dim": _first_attr(config, "linear_value_head_dim", "linear_head_dim"),
        # Mamba-2 layers (nemotron_h, granitemoehybrid): heads, head dim, state size, scan chunk
        "ssm_heads": _first_attr(config, "mamba_num_heads", "mamba_n_heads"),
        "ssm_head_dim": _first_attr(config, "mamba_head_dim", "mamba_d_head"),
        "ssm_state_size": _first_attr(config, "ssm_state_size", "mamba_d_state"),
        "ssm_chunk_size": _first_attr(config, "mamba_chunk_size", "chunk_size"),
        "lightning_block_size": _first_attr(config, "block_size"),  # MiniMax's lightning attention blocks
        "zero_experts": int(_first_attr(config, "zero_expert_num", default=0) or 0),  # LongCat-Flash's identity ones
        # Inkling 2's block attention residuals: layers summed into one block before it joins the stacked states
        "attention_residual_block": _first_attr(config, "n_layers_per_attn_res_block"),
        "attn_logit_softcapping": _first_attr(config, "attn_logit_softcapping"),
        "final_logit_softcapping": _first_attr(config, "final_logit_softcapping"),
        "attn_implementation": str(getattr(config, "_attn_implementation", None) or "sdpa"),
    }


def _one_size(size: Any) -> Any:
    """A size given per layer (Gemma 3n's intermediate_size list) is one size when every layer has it."""
    if isinstance(size, (list, tuple)):
        if len(set(size)) != 1:
            raise ValueError(f"intermediate sizes differ between layers ({sorted(set(size))})")
        return size[0]
    return size


def _qk_head_dim(config: Any, head_dim: int) -> int:
    """Dims of a query-key dot: `qk_head_dim`, else multi-latent attention's non-rotary + rotary parts (a config
    without the sum, e.g. dots3_note), else head_dim."""
    nope, rope = getattr(config, "qk_nope_head_dim", None), getattr(config, "qk_rope_head_dim", None)
    mla = int(nope) + int(rope) if nope is not None and rope is not None else 0
    return int(_first_attr(config, "qk_head_dim", default=0) or mla or head_dim)


def _experts_per_token(config: Any) -> int:
    return int(_first_attr(config, *_EXPERTS_PER_TOKEN_KEYS, default=0) or 0)
