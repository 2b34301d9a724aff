"""Model shapes from the Hugging Face hub, for a `model.hub_id` (config.json only, never weights)."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Optional

# One HEAD request to the hub decides whether to ask it at all: huggingface_hub's own client retries a
# failed request five times with back-off (1 + 2 + 4 + 8 + 8 s), so an unreachable hub took ~27 s to refuse.
PROBE_TIMEOUT_S = 3.0
HINT = ("pass the model's config fields instead: a preset (model=llama3_1_8b, see hydra_configs/model/) or "
        "the config.json keys as overrides (model.hf_config.model_type=llama model.hf_config.hidden_size=4096 ...), "
        "or run where the hub is reachable once so the file is cached")


class HubUnreachable(ValueError):
    pass


def hub_endpoint() -> str:
    """The hub huggingface_hub talks to (`HF_ENDPOINT`, else huggingface.co)."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline_by_setting() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value: the user asked for no network."""
    return any(os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def probe_hub(timeout_s: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """None where the hub answers one HEAD request within `timeout_s` (any HTTP status counts: it is there),
    else why not. The request runs in a daemon thread so that a slow name lookup, which socket timeouts do
    not bound, is cut at `timeout_s` too."""
    if offline_by_setting():
        return "HF_HUB_OFFLINE is set"
    endpoint = hub_endpoint()
    outcome: Dict[str, str] = {}

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
            outcome["ok"] = ""
        except urllib.error.HTTPError:
            outcome["ok"] = ""
        except Exception as error:  # DNS failure, refused, reset, TLS, timeout
            outcome["error"] = f"{type(error).__name__}: {getattr(error, 'reason', error)}"

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "ok" in outcome:
        return None
    return f"{endpoint} unreachable ({outcome.get('error', f'no answer within {timeout_s:g} s')})"


def fetch_hub_config(hub_id: str, timeout_s: int = 10) -> Dict[str, Any]:
    """`config.json` of `hub_id`: from the hub where one short probe reaches it, else from the local cache,
    else a clear error within a few seconds that says how to give the fields instead."""
    from huggingface_hub import hf_hub_download

    problem = probe_hub()
    try:
        if problem is None:
            os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(timeout_s))
            os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(timeout_s))
            path = hf_hub_download(repo_id=hub_id, filename="config.json")
        else:
            path = hf_hub_download(repo_id=hub_id, filename="config.json", local_files_only=True)
    except Exception as error:  # not cached, gated repo, missing repo
        reason = problem or f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        raise HubUnreachable(
            f"model.hub_id={hub_id!r}: could not fetch its config.json from the Hugging Face hub ({reason}"
            f"{', and it is not in the local cache' if problem else ''}); {HINT}") from error
    with open(path) as handle:
        return json.load(handle)
