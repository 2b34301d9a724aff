"""One line per bad input: composition and validation errors turned into `field=value rule` messages."""

from __future__ import annotations

import difflib
import re
from typing import Iterable, List, Optional, Sequence, Tuple


class ConfigRejected(ValueError):
    """Values of a composed config that break a rule; each problem names its field, value and rule."""

    def __init__(self, field: str, value: object, rule: str):
        self.problems: List[Tuple[str, object, str]] = [(field, value, rule)]
        super().__init__(self._text())

    @classmethod
    def of(cls, problems: Sequence[Tuple[str, object, str]]) -> "ConfigRejected":
        error = cls(*problems[0])
        error.problems = list(problems)
        error.args = (error._text(),)
        return error

    @property
    def fields(self) -> List[str]:
        return [field for field, _, _ in self.problems]

    def _text(self) -> str:
        return "; ".join(f"{field}={_shown(value)} {rule}" for field, value, rule in self.problems)


def _shown(value: object) -> str:
    return repr(value.value if hasattr(value, "value") and not isinstance(value, (int, float)) else value)


def nearest(value: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest choice by difflib's ratio, or nothing."""
    by_lower = {str(choice).lower(): str(choice) for choice in choices}
    match = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[match[0]]!r}?)" if match else ""


def explain(error: BaseException) -> str:
    """The one line a user sees for any composition error: the field, the value, the rule; no traceback."""
    if isinstance(error, ConfigRejected):
        return str(error)
    chain = list(_causes(error))
    for item in chain:
        text = _yaml_line(item) or _omegaconf_line(item)
        if text:
            return text
    first = _first_line(chain[-1]) if chain else str(error)
    return _first_line(error) if _first_line(error) and "see the cause" not in str(error) else first


def _causes(error: BaseException) -> Iterable[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


_OPTIONS = re.compile(r"Available options in '[^']*':\s*(.*)", re.S)


def _omegaconf_line(error: BaseException) -> Optional[str]:
    """OmegaConf puts the field in `full_key`; Hydra's own errors carry the override in their text."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    if isinstance(error, MissingConfigException):
        return _missing_option(error)
    if isinstance(error, OverrideParseException):
        return f"cannot parse the override: {_first_line(error)} (quote values with spaces or brackets)"
    if not isinstance(error, OmegaConfBaseException):
        return None
    key = getattr(error, "full_key", None) or ""
    message = str(getattr(error, "msg", "") or error).split("\n")[0].strip()
    if isinstance(error, MissingMandatoryValue):
        return f"{key} has no value: give it on the command line ({key}=...)"
    if "Invalid value" in message and "expected one of" in message:
        value = re.search(r"Invalid value '([^']*)'", message)
        choices = re.search(r"expected one of \[(.*)\]", message)
        options = [c.strip() for c in choices.group(1).split(",")] if choices else []
        shown = value.group(1) if value else "?"
        return f"{key}={shown!r} must be one of {', '.join(options)}{nearest(shown, options)}"
    if "not in" in message and message.startswith("Key"):
        unknown = key.rsplit(".", 1)[-1]
        known = _known_keys(error)
        where = key.rsplit(".", 1)[0] if "." in key else "the config"
        type_name = getattr(getattr(error, "object_type", None), "__name__", "")
        listed = f" ({type_name}: {', '.join(known)})" if known and len(known) <= 8 else ""
        owners = _engines_with_option(unknown) if where == "engine" else []
        if owners:  # another engine's option: say whose, not which of this engine's names it resembles
            return f"{key} is an option of engine={' / engine='.join(owners)}, not a field of {where}{listed}"
        return f"{key} is not a field of {where}{nearest(unknown, known) or listed}"
    converted = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", message)
    if converted:
        return f"{key}={converted.group(1)!r} must be {'an' if converted.group(2)[0] in 'AEIOU' else 'a'} {converted.group(2).lower()}"
    return f"{key}: {message}" if key else message


def _yaml_line(error: BaseException) -> Optional[str]:
    """A config file that is not YAML: the file, line and column of the fault, as an editor reads them."""
    import yaml

    if not isinstance(error, yaml.MarkedYAMLError):
        return None
    mark = error.problem_mark or error.context_mark
    where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}: " if mark else ""
    what = " ".join(part for part in (error.problem, error.context) if part)
    return f"{where}not valid YAML: {what}"


def _engines_with_option(option: str) -> List[str]:
    """The engines whose option dataclass has `option` (harness.config.schema.ENGINE_OPTIONS)."""
    from dataclasses import fields

    from harness.config.schema import ENGINE_OPTIONS

    return [engine.value for engine, options in ENGINE_OPTIONS.items()
            if option in {f.name for f in fields(options)}]


def _known_keys(error: BaseException) -> List[str]:
    object_type = getattr(error, "object_type", None)
    fields = getattr(object_type, "__dataclass_fields__", None)
    return list(fields) if fields else []


def _missing_option(error: BaseException) -> str:
    text = str(error)
    option = re.search(r"Could not (?:find|load) '([^']*)'", text)
    options_match = _OPTIONS.search(text)
    listed_options = options_match.group(1).split("Config search path")[0] if options_match else ""
    options = [o for o in re.findall(r"[\w./-]+", listed_options) if not o.endswith("_schema")]
    name = option.group(1).rsplit("/", 1)[-1] if option else "?"
    field = option.group(1).rsplit("/", 1)[0] if option and "/" in option.group(1) else "config"
    listed = f": one of {', '.join(options)}" if options else ""
    return f"{field}={name!r} is not a preset in hydra_configs/{field}/ or recipes/{nearest(name, options)}{listed}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().split("\n")[0]
    return text
