"""Model shapes from the Hugging Face hub, for a `model.hub_id` (config.json only, never weights)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict


class HubUnreachable(ValueError):
    pass


def fetch_hub_config(hub_id: str, timeout_s: int = 10) -> Dict[str, Any]:
    """Download only `config.json` of `hub_id`; a clear error where the hub cannot be reached."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(timeout_s))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(timeout_s))
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id=hub_id, filename="config.json")
    except Exception as error:  # offline mode, DNS failure, gated repo, missing repo
        raise HubUnreachable(
            f"model.hub_id={hub_id!r}: could not fetch its config.json from the Hugging Face hub "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). "
            "Use a preset from hydra_configs/model/ or give the fields under model.hf_config."
        ) from error
    with open(path) as handle:
        return json.load(handle)
