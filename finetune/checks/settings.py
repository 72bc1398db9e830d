"""Settings: the recipe file, the command line, `key=value`, each value against its type, and the typed
config (finetune/config.py) as a whole.

The config's rules run once: as the config is loaded, every rule whose `needs` (the task, the problem
type) are known; the rest once the data has decided them (`finetune.config.resolved`). Nothing here
imports the config: a rule reads the settings it names, by attribute. `MEMORY`: the settings of a
training command against this machine's memory (finetune/cli.py), not asked of a saved config that is
evaluated elsewhere.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

from finetune import lora
from finetune.checks import rule
from finetune.checks.streams import SETTINGS as STREAMING
from finetune.formats import SPLIT_FOLDERS
from finetune.metrics import CHOICES, MULTI, PROBLEMS, REGRESSION, SPANS, TOKENS
from finetune.tasks import TASKS, task_of

# --- tables the rules read ---------------------------------------------------------------------------

# Command-line modes that older versions kept as settings (and saved in config.yaml and manifests):
# dropped when a saved config is read, pointed to their flag when given as key=value.
MODE_FLAGS = {"dry_run": "--dry-run", "plan_only": "--plan-only"}

MAPPING_EXAMPLES = {"peft": "{r: 8, alpha: 16}", "model_config": "{model_type: bert, hidden_size: 128}"}

# model_config keys the app sets from the data (finetune/models.py build_model), and what to set instead.
LABEL_KEYS = {
    "num_labels": "the labels found in the data decide it (label_names fixes the set and its order)",
    "id2label": "set label_names=[...] (the names in id order)",
    "label2id": "set label_names=[...] (the names in id order)",
    "problem_type": "set problem_type= (a setting of its own)",
}

# transformers' TrainingArguments that are not settings here, and what does their work.
PRECISION = ("the precision is accelerate's: launch with --mixed_precision {} (or an accelerate config such as "
             "accelerate_configs/cpu_bf16.yaml, single_gpu_bf16.yaml, single_gpu_fp16.yaml)")
EVALUATION = "validation runs at each epoch's end, and every eval_steps optimizer steps when set"
OTHER_TOOLS = {
    "fp16": PRECISION.format("fp16"),
    "bf16": PRECISION.format("bf16"),
    "evaluation_strategy": EVALUATION,
    "eval_strategy": EVALUATION,
    "save_strategy": "checkpoints are saved every save_steps optimizer steps, and at each epoch's end with "
                     "save_at_epoch_end=true",
    "logging_strategy": "the loss is logged every logging_steps optimizer steps",
    "logging_dir": "the logs are written into output_dir: metrics.jsonl, and with report_to=tensorboard the "
                   "tracker's files under <output_dir>/<run name>/",
    "task_name": "run_glue's GLUE task is a data set here: dataset_name=glue dataset_config_name=<task> (e.g. mnli)",
    "pad_to_max_length": "each batch is padded to its longest sample; to pad to fixed lengths set length_buckets "
                         "(or pad_to_multiple_of)",
    "do_train": "a run always trains; test_file=... adds the test evaluation",
    "do_eval": "a run evaluates on validation_file (or a held-out share of the training data) as it trains",
    "do_predict": "predictions on a file come from finetune/evaluate_checkpoint.py <export> --data <file>",
    "max_seq_length": "the tokenizer's limit is max_length",
    "optim": "the optimizer is AdamW (fused where the device has one); set learning_rate, weight_decay, adam_beta1, "
             "adam_beta2 and adam_epsilon",
}
# Keys other tools' configs use to build on another file (mmengine's _base_, ...; Hydra's defaults: below).
INCLUDE = ("a recipe does not include another; give the base recipe to --config and your settings after it as "
           "key=value, or copy the base recipe and edit the copy")  # fmt: skip
OTHER_TOOLS.update(dict.fromkeys(("include", "includes", "_include_", "_base_", "base", "extends",
                                  "inherit", "inherits", "import", "imports"), INCLUDE))  # fmt: skip

# Short names other tools and papers use for settings here (too far from the name for difflib).
SHORT_NAMES = {
    "lr": "learning_rate", "epochs": "num_train_epochs", "num_epochs": "num_train_epochs",
    "n_epochs": "num_train_epochs", "max_epochs": "num_train_epochs", "batch_size": "per_device_train_batch_size",
    "bs": "per_device_train_batch_size", "train_batch_size": "per_device_train_batch_size",
    "eval_batch_size": "per_device_eval_batch_size", "model": "model_name_or_path", "model_name": "model_name_or_path",
    "model_id": "model_name_or_path", "base_model": "model_name_or_path",
    "checkpoint": "model_name_or_path (to start from a model) or resume_from_checkpoint (to continue a run)",
    "warmup": "warmup_ratio (or warmup_steps)", "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation": "gradient_accumulation_steps", "accumulation_steps": "gradient_accumulation_steps",
    "model_type": "model_config.model_type (a model built from a config; a pretrained one: model_name_or_path)",
    "max_len": "max_length", "seq_len": "max_length", "wd": "weight_decay", "out_dir": "output_dir",
}  # fmt: skip

# What a recipe file's YAML error means, and its fix.
YAML_FIXES = {
    "could not determine a constructor": "; a recipe holds plain values: remove the tag (a !!python/... tag is "
                                         "never run)",
    "another document": "; a recipe is one YAML document: remove the '---' line and what follows it, or merge them",
    "'\\t' that cannot start any token": "; indent with spaces: YAML allows no tabs there",
}
DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"  # hyphen, non-breaking hyphen, figure, en and em dash, bar, minus

AUGMENT_OPS = ("crop", "color", "trivial")  # finetune/images.py, Augment
MANIFEST = "manifest.json"  # a checkpoint's (finetune/rundir.py names it too)


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- the recipe file -------------------------------------------------------------------------------------


@rule("settings.recipe_missing")
def recipe_missing(recipe: Path) -> str | None:
    """`--config` names no file: not found, or a folder."""
    if not recipe.is_file():
        return f"config file {'is a folder, not a recipe file' if recipe.is_dir() else 'not found'}: {recipe}"
    return None


@rule("settings.recipe_not_yaml")
def recipe_not_yaml(recipe: Path, error: Exception, saved: bool) -> str | None:
    """A recipe YAML does not parse: its line, and the fix for the usual causes (a tab, a `!!python` tag,
    a second document); a run's own config.yaml can be repaired or deleted (the checkpoint has its config)."""
    import yaml

    if not isinstance(error, yaml.YAMLError):
        return None
    mark = getattr(error, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    problem = str(getattr(error, "problem", error))
    fix = next((fix for sign, fix in YAML_FIXES.items() if sign in problem), "")
    if saved:  # the run's own config.yaml, edited or damaged since the run wrote it
        fix += f"; repair it, or delete it: a resume then reads the config saved in its checkpoint's {MANIFEST}"
    return f"{recipe} is not valid YAML{where}: {problem}{fix}"


@rule("settings.recipe_not_text")
def recipe_not_text(recipe: Path, error: Exception, saved: bool) -> str:
    """A recipe that is not UTF-8 text (a binary file given to --config)."""
    return f"{recipe} is not a text file (UTF-8); a recipe is a YAML file of settings"


RECIPE_FILE = [recipe_missing]
RECIPE_UNREAD = [recipe_not_yaml, recipe_not_text]


@rule("settings.recipe_empty")
def recipe_empty(recipe: Path, raw: Any) -> str | None:
    """A recipe file with no settings in it."""
    if raw is None:
        return f"{recipe} is empty; a recipe is a YAML mapping of settings (finetune/configs/ has examples)"
    return None


@rule("settings.recipe_not_a_mapping")
def recipe_not_a_mapping(recipe: Path, raw: Any) -> str | None:
    """A recipe whose YAML is a list or a value, not a mapping of settings."""
    if not isinstance(raw, dict):
        return f"{recipe} must hold a mapping of config keys, got {type(raw).__name__}"
    return None


RECIPE = [recipe_empty, recipe_not_a_mapping]


@rule("settings.saved_config_value")
def saved_config_value(recipe: Path, error: Exception) -> str:
    """A value of a run's own config.yaml (edited since the run) that its check refuses: said as the saved
    file's, with how to repair it (the checkpoint's manifest holds the config too)."""
    return (f"{recipe}, the run's saved config: {error}; repair it there, or delete it: a resume then reads the "
            f"config saved in its checkpoint's {MANIFEST}")


SAVED_CONFIG = [saved_config_value]


@rule("settings.environment_variable")
def environment_variable(key: str, value: Any) -> str | None:
    """A path setting written with `$HOME` or `${VAR}`: settings are read as written, never expanded."""
    if isinstance(value, str) and re.search(r"\$(\{\w+\}|[A-Za-z_]\w*)", value):
        return (f"{key}={value}: environment variables are not expanded in settings; write the path out "
                f"(on the command line the shell expands it: {key}=$HOME/...)")
    return None


PATHS = [environment_variable]


@rule("settings.help_recipe_unread", warning=True)
def help_recipe_unread(path: Path, unread: str | None) -> str | None:
    """`--help --config <recipe>` whose recipe cannot be read: the help prints the defaults, and says so."""
    if unread is not None:
        return f"--config {path} is {unread}; the help shows the defaults"
    return None


HELP = [help_recipe_unread]


# --- `key=value` and `--key value` ----------------------------------------------------------------------


@rule("settings.option_dashes")
def option_dashes(item: str) -> str | None:
    """An option typed with a dash that is not '-' (a web page's or a word processor's en dash)."""
    if item and item[0] in DASHES:
        return (f"'{item}' starts with '{item[0]}' (U+{ord(item[0]):04X}), a dash that is not '-': type the option's "
                "dashes again")
    return None


@rule("settings.full_width_equals")
def full_width_equals(item: str) -> str | None:
    """`max_steps＝2`: a full-width equals sign, which is not '='."""
    if "=" not in item and "\uff1d" in item:
        return f"'{item}' has '\uff1d' (U+FF1D, a full-width equals sign), not '='; type it again"
    return None


@rule("settings.recipe_without_option")
def recipe_without_option(item: str) -> str | None:
    """A recipe file given on the command line without `--config`."""
    if "=" not in item and Path(item).expanduser().is_file() and Path(item).suffix.lower() in (".yaml", ".yml"):
        return f"'{item}' is a file given without its option: a recipe goes after --config ({item})"
    return None


@rule("settings.file_without_key")
def file_without_key(item: str) -> str | None:
    """A data file given on the command line without saying which split it is."""
    if "=" not in item and Path(item).expanduser().is_file():
        return (f"'{item}' is a file given without a key: name its split, train_file={item} (or validation_file=, "
                "test_file=)")
    return None


@rule("settings.not_key_value")
def not_key_value(item: str) -> str | None:
    """A setting that is not `key=value` (spaces around '=', a bare word)."""
    if "=" not in item:
        return f"expected key=value, got '{item}' (no spaces around '=': learning_rate=3e-5)"
    return None


@rule("settings.empty_key")
def empty_key(item: str) -> str | None:
    """`=value`: nothing before the '='."""
    if not item.partition("=")[0].strip():
        return f"expected key=value, got '{item}': the key before '=' is empty"
    return None


@rule("settings.value_comment")
def value_comment(item: str) -> str | None:
    """An unquoted value with ' #' in it: YAML reads the rest as a comment, which would cut the value."""
    key, _, text = item.partition("=")
    if re.search(r"(^|\s)#", text) and not re.search("[\"']", text):
        fix = ("remove the comment (a list or a mapping cannot be one quoted string)" if text.lstrip()[:1] in "[{"
               else f"quote it: {key.strip()}='\"{text.strip()}\"'")  # fmt: skip
        return (f"{key.strip()}={text}: YAML reads '#' at the start of a value or after a space as a comment, which "
                f"would cut the value; {fix}")
    return None


OVERRIDE = [option_dashes, full_width_equals, recipe_without_option, file_without_key, not_key_value, empty_key,
            value_comment]  # fmt: skip


@rule("settings.value_key_twice")
def value_key_twice(key: str, text: str, error: Exception) -> str | None:
    """A mapping given on the command line that sets one key twice (`model_config={a: 1, a: 2}`)."""
    problem = getattr(error, "problem", None)
    if type(error).__name__ == "DuplicateKey":
        return f"{key}={text}: {problem}"
    return None


@rule("settings.value_unclosed")
def value_unclosed(key: str, text: str, error: Exception) -> str | None:
    """A list or mapping that opens and never closes: the shell split the value at its spaces."""
    opened = text.lstrip()[:1]
    closing = "]" if opened == "[" else "}"
    if opened in ("[", "{") and closing not in text:
        return (f"{key}={text}: the value opens a YAML {'list' if opened == '[' else 'mapping'} with '{opened}' and "
                f"never closes it: the shell splits a value at its spaces; quote it ({key}='{text.strip()} "
                f"...{closing}') or leave out the spaces")
    return None


@rule("settings.value_not_yaml")
def value_not_yaml(key: str, text: str, error: Exception) -> str | None:
    """A list or mapping on the command line that does not parse (a comma or a bracket amiss)."""
    opened = text.lstrip()[:1]
    if opened in ("[", "{"):
        closing = "]" if opened == "[" else "}"
        return (f"{key}={text}: the value opens a YAML {'list' if opened == '[' else 'mapping'} with '{opened}' that "
                f"does not parse ({getattr(error, 'problem', None) or 'not valid YAML'}); check the closing "
                f"'{closing}' and the commas")
    return None


# Where the value is neither: it is read as the string it is (None: no refusal).
OVERRIDE_UNPARSED = [value_key_twice, value_unclosed, value_not_yaml]


@rule("settings.subkey_empty")
def subkey_empty(key: str, hint: Any, mappings: list[str]) -> str | None:
    """`model_config.=32`: nothing after the dot."""
    name, _, sub = key.partition(".")
    if not sub.strip():
        return f"{key}: the key after the dot is empty; KEY.SUBKEY=value sets one key of a mapping ({name}.hidden_size=32)"
    return None


@rule("settings.subkey_of_no_mapping")
def subkey_of_no_mapping(key: str, hint: Any, mappings: list[str]) -> str | None:
    """KEY.SUBKEY (learning_rate.x=1) where KEY is no mapping setting: it sets one key of a mapping."""
    if dict not in (typing.get_origin(hint), *map(typing.get_origin, typing.get_args(hint))):
        return f"{key}: {key.partition('.')[0]} is not a mapping; KEY.SUBKEY=value works for {', '.join(mappings)}"
    return None


SUBKEY = [subkey_empty, subkey_of_no_mapping]


@rule("settings.flag_of_other_tools")
def flag_of_other_tools(token: str) -> str | None:
    """transformers' flags (`--do_train`, `--fp16`, ...), which this app does otherwise: what does their work."""
    name = token[2:].split("=", 1)[0] if token.startswith("--") else None
    if name in OTHER_TOOLS:
        return f"{token} is a flag of transformers' scripts, not of this one: {OTHER_TOOLS[name]}"
    return None


OTHER_TOOLS_FLAG = [flag_of_other_tools]


@rule("settings.flag_short_name")
def flag_short_name(head: str, names: set[str]) -> str | None:
    """`--lr 1e-4`: another tool's short name of a setting, as a flag."""
    short = SHORT_NAMES.get(head.replace("-", "_").lower())
    if short is not None and short.split()[0] in names:
        return f"unknown setting --{head}: the setting is {short} ({short.split()[0]}=VALUE)"
    return None


@rule("settings.flag_misspelt")
def flag_misspelt(head: str, names: set[str]) -> str | None:
    """A setting's flag mistyped, close to one (--learning_rat for --learning_rate)."""
    close = difflib.get_close_matches(head.replace("-", "_").lower(), sorted(names), n=1, cutoff=0.8)
    if close:
        return f"unknown setting --{head}; did you mean --{close[0]} ({close[0]}=VALUE)?"
    return None


FLAG_UNKNOWN = [flag_short_name, flag_misspelt]  # (nothing: an option of the command, left to argparse)


@rule("settings.flag_without_value")
def flag_without_value(name: str) -> str:
    """`--output_dir` with nothing after it, for a setting that is not true/false."""
    return f"--{name} needs a value: --{name} VALUE, --{name}=VALUE or {name}=VALUE"


FLAG_WITHOUT_VALUE = [flag_without_value]


@rule("settings.usage")
def usage(message: str, hint: str) -> str:
    """argparse refused the command line (an unknown option, a missing argument): its words, then the
    command's options."""
    return f"{message}{'; ' + hint if hint else ''}"


USAGE = [usage]


@rule("settings.option_twice")
def option_twice(option: str, current: Any, default: Any, value: Any) -> str | None:
    """An option of one value given twice (--config twice, with two recipes): not the last kept silently."""
    if current not in (None, default):
        return (f"{option} is given twice ({current} and {value}); give it once (settings of another recipe: "
                "key=value after it)")
    return None


OPTION_GIVEN = [option_twice]


@rule("settings.given_twice", warning=True)
def given_twice(key: str, first: Any, then: Any) -> str | None:
    """A key given twice on the command line with two values: the last is used, as argparse does, with a
    word (a pasted or edited command often repeats one)."""
    if first != then:
        return f"{key} is given twice on the command line ({key}={first}, then {key}={then}); the last, {then}, is used"
    return None


GIVEN_TWICE = [given_twice]


@rule("settings.split_share_unread", warning=True)
def split_share_unread(given: dict[str, Any], cfg) -> str | None:
    """validation_split_percentage given beside a validation_file, which makes it unread (and a streamed run,
    which cannot hold out a share of its stream, needs the file)."""
    if "validation_split_percentage" in given and cfg.validation_file:
        instead = ("a streamed run needs it: leave validation_split_percentage out" if cfg.streaming else
                   "to hold out a share instead, add validation_file=null")  # fmt: skip
        return (f"validation_split_percentage={given['validation_split_percentage']} is not read: a share of the "
                f"training data is held out only without a validation_file (this run's: {cfg.validation_file}); "
                f"{instead}")
    return None


GIVEN_BESIDE = [split_share_unread]


@rule("settings.modes_both")
def modes_both(dry_run: bool, plan_only: bool) -> str | None:
    """`--dry-run` and `--plan-only` together: they print two different plans."""
    if dry_run and plan_only:
        return ("--dry-run and --plan-only print two different plans (the run's steps and learning rates; the layer "
                "split's devices): give one of them")
    return None


MODES = [modes_both]


@rule("settings.resumed_data_moved")
def resumed_data_moved(key: str, path: str | None, given: set[str]) -> str | None:
    """A resume whose run's data file is no longer where the run read it (moved or renamed since)."""
    if path and key not in given and not Path(path).expanduser().exists():
        return (f"the run's {key} {path} is not found (moved or renamed since the run?); resume with "
                f"{key}=<its path now> (the training file is checked against the bytes the run trained on)")
    return None


RESUMED_DATA = [resumed_data_moved]


# --- unknown keys ---------------------------------------------------------------------------------------


@rule("settings.mode_as_setting")
def mode_as_setting(key: str, known: list[str], value: Any) -> str | None:
    """A flag of the command (--dry-run, --plan-only) given as a setting, dry_run=true."""
    if key in MODE_FLAGS:
        return f"{key} is not a setting; pass the flag {MODE_FLAGS[key]}"
    return None


@rule("settings.dotted_key_in_recipe")
def dotted_key_in_recipe(key: str, known: list[str], value: Any) -> str | None:
    """`model_config.hidden_size:` written in a recipe: the command line's form of one key of a mapping."""
    head, dot, sub = key.partition(".")
    if dot and head in known:
        return (f"unknown config key '{key}': in a recipe write {head}: {{{sub}: ...}} (KEY.SUBKEY=value is the "
                "command line's form)")
    return None


@rule("settings.model_config_json")
def model_config_json(key: str, known: list[str], value: Any) -> str | None:
    """A model's config.json given as a recipe."""
    if key in ("architectures", "_name_or_path", "transformers_version"):
        return (f"unknown config key '{key}': that file is a model's config.json, not a recipe; give the model as "
                "model_name_or_path=<its folder>, and a recipe (finetune/configs/) to --config")
    return None


@rule("settings.accelerate_config_as_recipe")
def accelerate_config_as_recipe(key: str, known: list[str], value: Any) -> str | None:
    """An accelerate config given to --config: it goes to `accelerate launch --config_file`."""
    if key in ("compute_environment", "distributed_type"):
        return (f"unknown config key '{key}': that file is an accelerate config; pass it to accelerate launch "
                "--config_file, and a recipe (finetune/configs/) to --config")
    return None


@rule("settings.nested_block")
def nested_block(key: str, known: list[str], value: Any) -> str | None:
    """A `training_args:` block that holds settings (another tool's layout): a recipe is flat."""
    inside = sorted(k for k in value if k in known) if isinstance(value, dict) else []
    if inside:
        shown = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
        return (f"unknown config key '{key}': a recipe is flat: move the settings under it ({shown}) to the top level "
                f"and drop '{key}:'")
    return None


@rule("settings.other_tools_key")
def other_tools_key(key: str, known: list[str], value: Any) -> str | None:
    """A TrainingArguments (or mmengine) key that is no setting here: what does its work."""
    if key in OTHER_TOOLS:
        return f"unknown config key '{key}': {OTHER_TOOLS[key]}"
    return None


@rule("settings.short_name")
def short_name(key: str, known: list[str], value: Any) -> str | None:
    """`lr`, `epochs`, `batch_size`: another tool's short name of a setting."""
    if key.lower() in SHORT_NAMES:
        return f"unknown config key '{key}': the setting is {SHORT_NAMES[key.lower()]}"
    return None


@rule("settings.hydra_defaults")
def hydra_defaults(key: str, known: list[str], value: Any) -> str | None:
    """A Hydra `defaults:` list: a recipe is one flat YAML file."""
    if key == "defaults" and isinstance(value, list):
        return ("unknown config key 'defaults': a recipe is one flat YAML file, not a Hydra config; write the "
                "settings themselves in it (one recipe's: --config <file>, then key=value to change some)")
    return None


@rule("settings.unknown_key")
def unknown_key(key: str, known: list[str], value: Any) -> str:
    """A key that is no setting, with the nearest one."""
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.52)  # not defaults -> peft (0.5)
    return f"unknown config key '{key}'{f'; did you mean {close[0]}?' if close else ''}"


UNKNOWN_KEY = [mode_as_setting, dotted_key_in_recipe, model_config_json, accelerate_config_as_recipe, nested_block,
               other_tools_key, short_name, hydra_defaults, unknown_key]  # fmt: skip


# --- a value against its type (finetune/config.py `_coerce` raises, these explain) ---------------------


def _member(hint: Any) -> Any:
    """The type a union names beside None (`int | None` -> int)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    return hint


@rule("settings.none_as_text")
def none_as_text(key: str, value: Any, hint: Any) -> str | None:
    """`key=None`: Python's word, which YAML reads as the text 'None'; unset is `null`."""
    optional = type(None) in typing.get_args(hint)
    if optional and isinstance(value, str) and value.strip() in ("None", "NONE", "Nil", "nil"):
        return (f"{key}={value.strip()} is the text {value.strip()!r}; to leave {key} unset write {key}=null (YAML's "
                "none)")
    return None


@rule("settings.output_dir_empty")
def output_dir_empty(key: str, value: Any, hint: Any) -> str | None:
    """`output_dir=` with nothing after it."""
    if key == "output_dir" and value is None:
        return "output_dir is empty; give the folder the run writes to (output_dir=runs/my-run)"
    return None


@rule("settings.null_for_a_value")
def null_for_a_value(key: str, value: Any, hint: Any) -> str | None:
    """null for a setting that has no unset value."""
    if value is None and _member(hint) is str:
        return (f"{key} cannot be null: leave it out (its default), or give a value (the word null as a value goes in "
                f"quotes: '{key}=\"null\"')")
    return None


@rule("settings.resume_true")
def resume_true(key: str, value: Any, hint: Any) -> str | None:
    """`resume_from_checkpoint=true`, the Trainer's way: here the newest checkpoint is `latest`."""
    if key == "resume_from_checkpoint" and value is True:
        return ("resume_from_checkpoint=true is not a value here: to resume from output_dir's newest checkpoint, set "
                "resume_from_checkpoint=latest; or give a checkpoint's folder")
    return None


@rule("settings.steps_as_a_share")
def steps_as_a_share(key: str, value: Any, hint: Any) -> str | None:
    """`warmup_steps=0.1`: a count of steps given a share, as the Trainer reads a number below 1."""
    share = {"warmup_steps": "warmup_ratio", "eval_steps": None, "save_steps": None, "logging_steps": None}
    if _member(hint) is int and key in share and isinstance(value, float) and 0 < value < 1:
        fix = f"set {share[key]}={value:g}" if share[key] else "give a count of optimizer steps"
        return (f"{key}={value:g} is a count of optimizer steps here, not a share of the training (as transformers' "
                f"Trainer reads a number below 1): {fix}")
    return None


@rule("settings.yaml_boolean_for_text")
def yaml_boolean_for_text(key: str, value: Any, hint: Any) -> str | None:
    """`text_column=yes`: YAML 1.1 reads yes, no, on, off as booleans."""
    if _member(hint) is str and isinstance(value, bool):
        return (f"{key} must be a string, but YAML read it as the boolean {str(value).lower()}: put it in quotes "
                f"('{key}=\"yes\"' on the command line, or the same quotes in a recipe)")
    return None


@rule("settings.yaml_booleans_in_list")
def yaml_booleans_in_list(key: str, value: Any, hint: Any) -> str | None:
    """`label_names=[no, yes]`: YAML read the names as booleans (or null)."""
    member = _member(hint)
    strings = typing.get_origin(member) is list and typing.get_args(member)[0] is str
    if strings and isinstance(value, list) and any(v is None or isinstance(v, bool) for v in value):
        words = ", ".join(repr({True: "yes", False: "no", None: "null"}.get(v, v) if v is None or isinstance(v, bool)
                               else str(v)) for v in value)  # fmt: skip
        return (f"{key} must hold strings, but YAML read some as booleans or null ({value!r}): put them in quotes "
                f"({key}=\"[{words}]\" on the command line, or the same quotes in a recipe)")
    return None


@rule("settings.text_column_pair")
def text_column_pair(key: str, value: Any, hint: Any) -> str | None:
    """`text_column=[premise, hypothesis]`: a pair is two settings."""
    if key == "text_column" and isinstance(value, list) and len(value) == 2:
        return f"text_column is one column, got {value!r}; for sentence pairs set text_column={value[0]} text_pair_column={value[1]}"
    return None


@rule("settings.wrong_type")
def wrong_type(key: str, value: Any, hint: Any) -> str:
    """A value of another type than its setting's: an integer, a number, true/false, a string, a list,
    a mapping or one of a few words."""
    member = _member(hint)
    origin = typing.get_origin(member)
    if origin is Literal:
        return f"{key} must be one of {', '.join(map(str, typing.get_args(member)))}, got {value!r}"
    if origin is list:
        return f"{key} must be a list, got {value!r}"
    if origin is dict:
        return f"{key} must be a mapping like {MAPPING_EXAMPLES.get(key, '{key: value}')}, got {value!r}"
    kind = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(member)
    return f"{key} must be {kind}, got {value!r}" if kind else f"{key}: bad value {value!r}"


WRONG_TYPE = [none_as_text, output_dir_empty, null_for_a_value, resume_true, steps_as_a_share, yaml_boolean_for_text,
              yaml_booleans_in_list, text_column_pair, wrong_type]  # fmt: skip


# --- the config: single settings --------------------------------------------------------------------------

FINITE = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
          "warmup_ratio", "num_train_epochs", "label_smoothing", "dropout", "validation_split_percentage")  # fmt: skip
POSITIVE = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
            "logging_steps", "max_nonfinite_loss_steps", "ddp_timeout", "pipeline_chunks", "max_length", "n_best_size",
            "max_answer_length")  # fmt: skip
POSITIVE_OR_NULL = ("max_steps", "eval_steps", "save_steps", "save_total_limit", "early_stopping_patience",
                    "cpu_threads", "max_train_samples", "max_eval_samples", "max_test_samples", "pad_to_multiple_of",
                    "image_size")  # fmt: skip
WEEK = 7 * 24 * 3600  # past a week, the timeouts of torch's backends overflow
# name: (whether a value is in range, the range in words); None passes (an unset setting)
RANGES: dict[str, tuple[typing.Callable[[Any], bool], str]] = {
    "seed": (lambda v: 0 <= v < 2**32, f"in [0, {2**32 - 1}]"),  # numpy's seeds; torch's and Python's take them
    "num_train_epochs": (lambda v: v > 0, "positive"),
    "adam_beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "adam_beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "adam_epsilon": (lambda v: v > 0, "> 0"),  # 0: 0/0 for a weight whose gradients have all been 0
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "max_grad_norm": (lambda v: v >= 0, ">= 0 (0 or null: no clipping)"),  # negative: flips the gradients
    "learning_rate": (lambda v: v > 0, "> 0"),
    "warmup_ratio": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "label_smoothing": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "warmup_steps": (lambda v: v >= 0, "positive (or null)"),
    "ddp_timeout": (lambda v: v <= WEEK, f"at most {WEEK} seconds (a week)"),
    "multi_label_threshold": (lambda v: 0 < v < 1, "in (0, 1)"),
    "dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "freeze_layers": (lambda v: v >= 0, ">= 0"),
    "length_buckets": (lambda v: 1 <= v <= 32, "between 1 and 32 (or null)"),
    "validation_split_percentage": (lambda v: 0 < v < 100, "in (0, 100)"),
    "dataloader_num_workers": (lambda v: v >= 0, ">= 0"),
    "doc_stride": (lambda v: v >= 0, ">= 0 (the tokens a long context's windows overlap)"),
    "text_windows": (lambda v: v >= 0, ">= 0 (the tokens a long text's windows overlap), or null to cut at max_length"),
    "stream_buffer": (lambda v: v >= 0, ">= 0 (0: the stream's own order)"),
}


@rule("settings.finite")
def finite(cfg) -> str | None:
    """A number setting that is NaN or infinite (`.inf`, `.nan` in YAML)."""
    bad = next((n for n in FINITE if getattr(cfg, n) is not None and not math.isfinite(getattr(cfg, n))), None)
    return f"{bad} must be a finite number, got {getattr(cfg, bad)}" if bad else None


@rule("settings.positive")
def positive(cfg) -> str | None:
    """A count that must be 1 or more: batch sizes, accumulation, logging steps, max_length, ..."""
    bad = next((n for n in POSITIVE if getattr(cfg, n) <= 0), None)
    return f"{bad} must be a positive integer, got {getattr(cfg, bad)}" if bad else None


@rule("settings.positive_or_null")
def positive_or_null(cfg) -> str | None:
    """A count that is 1 or more, or null (unset): max_steps, the cadences, the sample limits, ..."""
    bad = next((n for n in POSITIVE_OR_NULL if getattr(cfg, n) is not None and getattr(cfg, n) <= 0), None)
    return f"{bad} must be positive (or null), got {getattr(cfg, bad)}" if bad else None


@rule("settings.out_of_range")
def out_of_range(cfg) -> str | None:
    """A setting outside its range: a probability past 1, a negative decay, a seed numpy cannot take, ..."""
    for name, (fits, words) in RANGES.items():
        value = getattr(cfg, name)
        if value is not None and not fits(value):
            return f"{name} must be {words}, got {value}"
    return None


@rule("settings.cpu_threads")
def cpu_threads(cfg) -> str | None:
    """More CPU threads than any machine has cores (OpenMP crashes at 100000)."""
    most = max(1024, os.cpu_count() or 1)  # not this machine's count: saved configs travel
    if cfg.cpu_threads is not None and cfg.cpu_threads > most:
        return (f"cpu_threads={cfg.cpu_threads} is more threads than any machine has cores (this one has "
                f"{os.cpu_count()}); use at most {most}, or null for this process's share of the cores")
    return None


@rule("settings.label_names_empty")
def label_names_empty(cfg) -> str | None:
    """`label_names=[]`."""
    if cfg.label_names is not None and not cfg.label_names:
        return "label_names is empty; list the labels, or leave it null to take them from the data"
    return None


@rule("settings.label_names_repeated")
def label_names_repeated(cfg) -> str | None:
    """A label listed twice in label_names."""
    repeated = sorted({n for n in cfg.label_names or () if cfg.label_names.count(n) > 1})
    return f"label_names lists {repeated[0]!r} twice; name each label once" if repeated else None


@rule("settings.warmup_past_max_steps")
def warmup_past_max_steps(cfg) -> str | None:
    """More warm-up steps than steps: the learning rate would never reach learning_rate."""
    if cfg.warmup_steps is not None and cfg.max_steps is not None and cfg.warmup_steps > cfg.max_steps:
        return (f"warmup_steps={cfg.warmup_steps} exceeds max_steps={cfg.max_steps}: the learning rate would never "
                "reach learning_rate; lower warmup_steps")
    return None


@rule("settings.unknown_tracker")
def unknown_tracker(cfg) -> str | None:
    """A `report_to` tracker Accelerate does not have."""
    if not cfg.report_to:
        return None
    from accelerate.utils import LoggerType  # accelerate imports torch: only when trackers are named

    trackers = {t.value for t in LoggerType}
    bad = next((name for name in cfg.report_to if name not in trackers), None)
    if bad is not None:
        return (f"report_to: unknown tracker {bad!r}; Accelerate's trackers are {', '.join(sorted(trackers))} (none, "
                "or [], for no tracker)")
    return None


@rule("settings.layer_split_setting_alone")
def layer_split_setting_alone(cfg) -> str | None:
    """pipeline_chunks, devices or max_memory without model_parallel=true: the model is not split."""
    if cfg.model_parallel:
        return None
    if cfg.pipeline_chunks > 1:
        return "pipeline_chunks needs model_parallel=true"
    if cfg.devices:
        return ("devices is for model_parallel=true; for data parallelism choose devices in the accelerate config "
                "(accelerate launch --gpu_ids ...)")
    if cfg.max_memory:
        return ("max_memory caps each device of the layer split and needs model_parallel=true; without it the model is "
                "not split (leave max_memory out)")
    return None


@rule("settings.freeze_layers_with_lora")
def freeze_layers_with_lora(cfg) -> str | None:
    """freeze_layers beside peft: LoRA already freezes every weight but its adapters."""
    if cfg.freeze_layers and cfg.peft is not None:
        return "freeze_layers and peft together: LoRA already freezes every weight but its adapters"
    return None


@rule("settings.no_model")
def no_model(cfg) -> str | None:
    """Neither a pretrained model nor a config to build one from."""
    if cfg.model_name_or_path is None and cfg.model_config is None:
        return "set model_name_or_path (a hub name or a local directory) or model_config"
    return None


@rule("settings.model_path_is_a_file")
def model_path_is_a_file(cfg) -> str | None:
    """A model, tokenizer or image processor given as one of its files (config.json) instead of its folder."""
    for key in ("model_name_or_path", "tokenizer_name", "image_processor_name"):
        value = getattr(cfg, key)
        if value and Path(value).expanduser().is_file():
            return f"{key}={value} is a file; give the folder that holds it ({Path(value).parent}), or a hub name"
    return None


@rule("settings.model_config_key_beside_name")
def model_config_key_beside_name(cfg) -> str | None:
    """`model_config.hidden_dropout_prob=...` beside a pretrained model: model_config builds a new model at
    random and needs a model_type; a pretrained model keeps its architecture."""
    if cfg.model_config is None or "model_type" in cfg.model_config or not cfg.model_name_or_path or not cfg.model_config:
        return None
    given = ", ".join(f"model_config.{k}" for k in list(cfg.model_config)[:2])
    drop = next((v for k, v in cfg.model_config.items() if "dropout" in k), None)
    fix = f"; its dropout is set with dropout={drop}" if drop is not None else ""
    return (f"{given} beside model_name_or_path: model_config builds a new model from random weights and needs a "
            f"model_type; a pretrained model keeps its architecture{fix}")


@rule("settings.model_config_without_type")
def model_config_without_type(cfg) -> str | None:
    """A model_config without model_type: transformers cannot tell which model to build."""
    if cfg.model_config is not None and "model_type" not in cfg.model_config:
        return "model_config needs a model_type, e.g. {model_type: bert, hidden_size: 32, ...}"
    return None


@rule("settings.model_config_label_key")
def model_config_label_key(cfg) -> str | None:
    """model_config.num_labels, id2label, label2id or problem_type: the data's labels set these."""
    key = next((k for k in LABEL_KEYS if cfg.model_config is not None and k in cfg.model_config), None)
    return f"model_config.{key} is set from the data's labels, not here; {LABEL_KEYS[key]}" if key else None


@rule("settings.peft_unknown_key")
def peft_unknown_key(cfg) -> str | None:
    """A key of `peft` that LoRA does not have."""
    unknown = sorted(set(cfg.peft or ()) - set(lora.DEFAULTS))
    return f"peft: unknown key(s) {unknown}; LoRA's settings are {', '.join(lora.DEFAULTS)}" if unknown else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@rule("settings.peft_value")
def peft_value(cfg) -> str | None:
    """A LoRA setting out of its range: the rank a positive integer, alpha positive, dropout in [0, 1), the
    target modules a list of names."""
    if cfg.peft is None:
        return None
    r, alpha, dropout, targets = (cfg.peft.get(k) for k in ("r", "alpha", "dropout", "target_modules"))
    if isinstance(r, bool) or not isinstance(r, int) or r <= 0:
        return f"peft.r must be a positive integer (the adapters' rank), got {r!r}"
    if not _number(alpha) or alpha <= 0:
        return f"peft.alpha must be a positive number (the scale is alpha / r), got {alpha!r}"
    if not _number(dropout) or not 0 <= dropout < 1:
        return f"peft.dropout must be in [0, 1), got {dropout!r}"
    if targets is not None and (not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets)):
        return f"peft.target_modules must be a list of module names like [query, value], got {targets!r}"
    return None


@rule("settings.unknown_augment")
def unknown_augment(cfg) -> str | None:
    """An image augmentation op that does not exist."""
    unknown = [op for op in cfg.augment if op not in AUGMENT_OPS]
    return f"augment: unknown op(s) {unknown}; the ops are {', '.join(AUGMENT_OPS)}" if unknown else None


@rule("settings.pair_is_the_text")
def pair_is_the_text(cfg) -> str | None:
    """text_pair_column is the text_column: each sentence would be paired with itself."""
    if cfg.text_pair_column is not None and cfg.text_pair_column == cfg.text_column:
        return ("text_pair_column is the text_column: each sentence would be paired with itself; set "
                "text_pair_column to the second sentence's column, or null")
    return None


@rule("settings.label_columns_repeated")
def label_columns_repeated(cfg) -> str | None:
    """label_columns empty, or naming a column twice."""
    columns = cfg.label_columns
    if columns is not None and not columns:
        return "label_columns is empty: name the 0/1 columns of the labels, or set label_columns=null"
    if columns is not None and len(set(columns)) != len(columns):
        return f"label_columns must name distinct columns, got {columns}"
    return None


@rule("settings.label_columns_not_multi_label")
def label_columns_not_multi_label(cfg) -> str | None:
    """label_columns (0/1 columns) beside a problem_type other than multi-label."""
    if cfg.label_columns is not None and cfg.problem_type not in (None, MULTI):
        return (f"label_columns (0/1 columns, one per label) is multi-label data, but problem_type is "
                f"{cfg.problem_type}; set problem_type=multi_label_classification or null")
    return None


@rule("settings.compile_layer_split")
def compile_layer_split(cfg) -> str | None:
    """torch_compile with the layer split: the stages move tensors between devices."""
    if cfg.torch_compile and cfg.model_parallel:
        return "torch_compile does not work with model_parallel=true (stages move tensors between devices)"
    return None


@rule("settings.compile_mode_alone")
def compile_mode_alone(cfg) -> str | None:
    """torch_compile_mode without torch_compile."""
    if cfg.torch_compile_mode != "default" and not cfg.torch_compile:
        return (f"torch_compile_mode={cfg.torch_compile_mode} needs torch_compile=true; add it, or leave "
                "torch_compile_mode out")
    return None


@rule("settings.no_training_data")
def no_training_data(cfg) -> str | None:
    """No train_file, data_dir or dataset_name (a resume with --config reads that recipe, not the run's)."""
    if cfg.dataset_name is None and cfg.train_file is None and cfg.data_dir is None:
        resuming = ("; a resume with --config reads that recipe, not the run's saved config.yaml: leave --config out "
                    "(resume_from_checkpoint=latest output_dir=<run> alone resumes with the run's own recipe)"
                    if cfg.resume_from_checkpoint else "")  # fmt: skip
        return f"no training data: set train_file, data_dir or dataset_name{resuming}"
    return None


@rule("settings.file_and_image_folder")
def file_and_image_folder(cfg) -> str | None:
    """train_file and an image folder's data_dir both named: the loader would read one and leave the other."""
    if cfg.train_file and cfg.data_dir and cfg.dataset_name in (None, "imagefolder"):
        return (f"train_file={cfg.train_file} and data_dir={cfg.data_dir} both name the training data; give one: "
                "train_file= for a data file (data_dir=null), data_dir= for an image folder (train_file=null)")
    return None


@rule("settings.output_inside_image_folder")
def output_inside_image_folder(cfg) -> str | None:
    """An output_dir where the image folder loader reads: the run's files would be read as data next time."""
    if not (cfg.data_dir and cfg.output_dir and not cfg.train_file):
        return None
    data, out = Path(cfg.data_dir).expanduser().resolve(), Path(cfg.output_dir).expanduser().resolve()
    inside = out.relative_to(data).parts if out == data or data in out.parents else None
    split_folders = data.is_dir() and any(p.is_dir() and p.name in SPLIT_FOLDERS for p in data.iterdir())
    if inside is not None and (not inside or inside[0] in SPLIT_FOLDERS or not split_folders):
        return (f"output_dir {cfg.output_dir} is inside data_dir {cfg.data_dir}, where the image folder loader reads: "
                "the run's files would be read as data by the next run; choose an output_dir outside it")
    return None


# --- the config: what needs the task -----------------------------------------------------------------------


@rule("settings.problem_of_task", needs=("task",))
def problem_of_task(cfg) -> str | None:
    """A problem_type the task does not solve (regression for a tagger)."""
    if cfg.problem_type and cfg.problem_type not in task_of(cfg.task).problems:
        return (f"problem_type={cfg.problem_type} is not a problem of {cfg.task}, which solves "
                f"{', '.join(task_of(cfg.task).problems)}; set problem_type to one of those, or null")
    return None


@rule("settings.freeze_embeddings_of_task", needs=("task",))
def freeze_embeddings_of_task(cfg) -> str | None:
    """freeze_embeddings for a model without a word-embedding table (an image model)."""
    if cfg.freeze_embeddings and not task_of(cfg.task).has_word_embeddings:
        return (f"freeze_embeddings is for models with a word-embedding table, not {cfg.task}: set "
                "freeze_embeddings=false (the text recipes set it), or use a recipe of that task (finetune/configs/)")
    return None


@rule("settings.label_is_an_input", needs=("task",))
def label_is_an_input(cfg) -> str | None:
    """The label column is also an input column: the model would read the answer."""
    if cfg.label_column in cfg.input_columns:
        modality = task_of(cfg.task).modality
        return (f"'{cfg.label_column}' is both the label column and a{'n' * (modality[0] in 'aeiou')} {modality} "
                f"column: the model would read the answer; set {modality}_column (or label_column) to another column")
    return None


@rule("settings.augment_without_images", needs=("task",))
def augment_without_images(cfg) -> str | None:
    """random_flip or augment on a run that has no images."""
    if task_of(cfg.task).modality != "image" and (cfg.random_flip or cfg.augment):
        what = "random_flip=true" if cfg.random_flip else f"augment=[{','.join(cfg.augment)}]"
        return f"{what} augments training images; a {cfg.task} run has none: leave it out"
    return None


@rule("settings.pair_for_tagging", needs=("task",))
def pair_for_tagging(cfg) -> str | None:
    """text_pair_column on a tagging run, which tags one list of words."""
    if TOKENS in task_of(cfg.task).problems and cfg.text_pair_column is not None:
        return (f"text_pair_column pairs two texts of a sentence classifier; a {cfg.task} run tags one list of words: "
                "leave text_pair_column out")
    return None


@rule("settings.tags_are_the_words", needs=("task",))
def tags_are_the_words(cfg) -> str | None:
    """tags_column is the tokens_column: the words would be read as their own tags."""
    if TOKENS in task_of(cfg.task).problems and cfg.tags_column == cfg.tokens_column:
        return (f"tags_column is the tokens_column ('{cfg.tokens_column}'): the words would be read as their own tags; "
                "set tags_column to the column of tag lists")
    return None


@rule("settings.input_among_label_columns", needs=("task",))
def input_among_label_columns(cfg) -> str | None:
    """An input column among label_columns: the model would read the answer."""
    mixed = next((c for c in cfg.label_columns or () if c in cfg.input_columns), None)
    if mixed is not None:
        return (f"label_columns holds '{mixed}', an input column of the run (the model would read the answer); remove "
                "it from label_columns")
    return None


@rule("settings.other_tasks_setting")
def other_tasks_setting(cfg, given: set[str]) -> str | None:
    """A setting only another task reads (label_all_tokens on a sentence classifier, group_by_length on
    images), given on the command line: it would be ignored. A recipe's own are left alone; random_flip and
    augment on text have their own rule."""
    if not cfg.task:
        return None
    own = task_of(cfg.task).own_settings
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cfg) if f.init}  # fmt: skip
    foreign = {name for t in TASKS.values() for name in t.own_settings} - own - {"random_flip", "augment"}
    named = [name for name in sorted(foreign & given) if getattr(cfg, name) != defaults[name]]
    if not named:
        return None
    owners = sorted({t.name for t in TASKS.values() for name in named if name in t.own_settings})
    owners = [", ".join(owners[:-1]), owners[-1]] if len(owners) > 2 else owners  # "a, b and c"
    shown = ", ".join(f"{n}={_shown(getattr(cfg, n))}" for n in named)
    one = len(named) == 1
    return (f"{shown} {'is a setting' if one else 'are settings'} of {' and '.join(owners)} runs, which "
            f"a{'n' * (cfg.task[0] in 'aeiou')} {cfg.task} run does not read: leave {'it' if one else 'them'} out "
            "(or, if the task is wrong, set task=)")


GIVEN = [other_tasks_setting]


# --- the config: what needs the problem type -----------------------------------------------------------------


def _metrics_of(problem: str | None, task: str | None = None) -> tuple[str, ...]:
    """The problem's metrics; before the data says the problem, those of the task's problems (or of all)."""
    if problem:
        return PROBLEMS[problem].reported
    problems = task_of(task).problems if task else tuple(PROBLEMS)
    return tuple(dict.fromkeys(m for p in problems for m in PROBLEMS[p].reported))


@rule("settings.metric_with_eval_prefix")
def metric_with_eval_prefix(cfg) -> str | None:
    """`metric_for_best_model=eval_accuracy`: the Trainer's prefix, which metrics here do not have."""
    given = cfg.metric_for_best_model
    name = (given or "").removeprefix("eval_")
    if given is not None and given not in _metrics_of(cfg.problem_type) and name != given and name in _metrics_of(cfg.problem_type):
        return f"metric_for_best_model={given}: the metric is named without the Trainer's eval_ prefix here: metric_for_best_model={name}"
    return None


@rule("settings.metric_of_no_problem")
def metric_of_no_problem(cfg) -> str | None:
    """A metric_for_best_model that no problem type reports (its problem type still unknown): the ones it
    may mean."""
    given = cfg.metric_for_best_model
    if given is None or cfg.problem_type is not None or given in _metrics_of(None, cfg.task):
        return None
    name = given.removeprefix("eval_")
    problems = {p: PROBLEMS[p] for p in (task_of(cfg.task).problems if cfg.task else PROBLEMS)}
    near = [f"{m} ({p})" for p, spec in problems.items() for m in spec.reported if name in m.split("_") and m != "loss"]
    return (f"metric_for_best_model must be a metric of the run's problem type, got {given!r}"
            + (f"; the ones it may mean: {', '.join(near)}" if near else "; each problem type's: " + "; ".join(
                f"{p}: {', '.join(spec.reported)}" for p, spec in problems.items())))


@rule("settings.metric_of_another_problem", needs=("problem_type",))
def metric_of_another_problem(cfg) -> str | None:
    """A metric_for_best_model that the run's problem type does not report."""
    metrics = _metrics_of(cfg.problem_type)
    if cfg.metric_for_best_model is not None and cfg.metric_for_best_model not in metrics:
        return (f"metric_for_best_model must be one of {', '.join(metrics)} for {cfg.problem_type}, got "
                f"{cfg.metric_for_best_model!r}")
    return None


@rule("settings.smoothing_without_classes", needs=("problem_type",))
def smoothing_without_classes(cfg) -> str | None:
    """label_smoothing for a regression or multi-label run, which has no cross-entropy over classes."""
    if cfg.problem_type in (REGRESSION, MULTI) and cfg.label_smoothing:
        return (f"label_smoothing={cfg.label_smoothing:g} smooths a cross-entropy over classes (single-label and "
                f"tagging); {cfg.problem_type} has none: leave label_smoothing at 0")
    return None


@rule("settings.class_weights_of_regression", needs=("problem_type",))
def class_weights_of_regression(cfg) -> str | None:
    """class_weights for a regression (a number has no class to weigh), question answering (nor a span) or
    multiple choice (the candidates' places are no classes of the data)."""
    if cfg.problem_type in (REGRESSION, SPANS, CHOICES) and cfg.class_weights is not None:
        what = {REGRESSION: "a regression", SPANS: "question answering (its answers are spans)",
                CHOICES: "multiple choice (its candidates' places are not classes)"}[cfg.problem_type]
        return f"class_weights={cfg.class_weights} weighs classes or labels; {what} has none: leave class_weights unset (null)"
    return None


@rule("settings.threshold_without_multi_label", needs=("problem_type",))
def threshold_without_multi_label(cfg) -> str | None:
    """multi_label_threshold, or tune_threshold=per_label, for a run that is not multi-label."""
    if cfg.problem_type == MULTI:
        return None
    if cfg.multi_label_threshold != 0.5:
        return (f"multi_label_threshold={cfg.multi_label_threshold:g} decides a multi-label run's labels; "
                f"{cfg.problem_type} has none (its prediction is the most probable class): leave multi_label_threshold out")
    if cfg.tune_threshold == "per_label":  # (the default, global, is simply unused outside multi-label)
        return (f"tune_threshold=per_label tunes each label's decision threshold of a multi-label run; "
                f"{cfg.problem_type} has none: leave tune_threshold out")
    return None


@rule("settings.threshold_replaced_by_tuning", warning=True, needs=("problem_type",))
def threshold_replaced_by_tuning(cfg) -> str | None:
    """A multi_label_threshold of the user's, which the threshold tuned on validation replaces after training."""
    if cfg.problem_type == MULTI and cfg.multi_label_threshold != 0.5 and cfg.tune_threshold != "off":
        return (f"multi_label_threshold={cfg.multi_label_threshold:g} decides the labels while training; after it, "
                f"tune_threshold={cfg.tune_threshold} replaces it with the threshold tuned on validation (the test "
                "split, the export): set tune_threshold=off to keep yours")
    return None


# The config's rules, in the order they are asked (the first refusal wins).
CONFIG = [
    finite, positive, positive_or_null, out_of_range, cpu_threads, label_names_empty, label_names_repeated,
    warmup_past_max_steps, unknown_tracker, layer_split_setting_alone, freeze_layers_with_lora, no_model,
    model_path_is_a_file, model_config_key_beside_name, model_config_without_type, model_config_label_key,
    peft_unknown_key, peft_value, unknown_augment, pair_is_the_text, label_columns_repeated, label_columns_not_multi_label, compile_layer_split,
    compile_mode_alone, no_training_data, file_and_image_folder, output_inside_image_folder,
    problem_of_task, freeze_embeddings_of_task, label_is_an_input, augment_without_images, pair_for_tagging,
    tags_are_the_words, input_among_label_columns,
    metric_with_eval_prefix, metric_of_no_problem, metric_of_another_problem, smoothing_without_classes,
    class_weights_of_regression, threshold_without_multi_label, threshold_replaced_by_tuning, *STREAMING,
]  # fmt: skip


# --- the settings against this machine ---------------------------------------------------------------


@rule("settings.image_batch_beyond_memory")
def image_batch_beyond_memory(cfg, memory: int | None) -> str | None:
    """An image_size whose one batch cannot fit in the machine's memory (image_size=100000): the run would be
    killed for memory at its first batch, without a line. The estimate is a lower bound, the batch's pixels
    alone as float32, twice (the image processor's arrays and the batch stacked from them); the model's
    activations are many times more. Asked of a training command, with this machine's memory."""
    if cfg.image_size is None or not memory:
        return None
    key = max(("per_device_train_batch_size", "per_device_eval_batch_size"), key=lambda k: getattr(cfg, k))
    batch, size = getattr(cfg, key), cfg.image_size
    need = 2 * batch * 3 * size * size * 4  # 3 channels of 4 bytes a pixel, twice
    if need <= memory:
        return None
    return (f"image_size={size}: one batch of {batch} images of {size}x{size} pixels ({key}={batch}) needs at "
            f"least {need / 2**30:,.1f} GiB for its pixels alone (float32, the processor's arrays and the stacked "
            f"batch), more than this machine's {memory / 2**30:,.1f} GiB of memory; leave image_size out for the "
            "image processor's own size, or set a few hundred pixels (224 to 600 is what such models train at)")


MEMORY = [image_batch_beyond_memory]


# --- the command line over a recipe ---------------------------------------------------------------------


@rule("settings.model_config_beside_name", warning=True)
def model_config_beside_name(raw: dict[str, Any], given: dict[str, Any]) -> str | None:
    """model_config and model_name_or_path both asked for on the command line: model_config builds the model
    at random, so the name's weights are left unread."""
    dotted = any(key.startswith("model_config.") for key in given)
    config = given["model_config"] if "model_config" in given else raw.get("model_config")
    name = given.get("model_name_or_path")
    if name is not None and (dotted or "model_config" in given) and (config is not None or dotted):
        use = ("is not used (tokenizer_name gives the tokenizer)" if raw.get("tokenizer_name") else
               "gives only the tokenizer, not its weights")  # fmt: skip
        return f"model_config builds the model at random, so model_name_or_path={name} {use}; to fine-tune {name}, set model_config=null"
    return None


@rule("settings.recipe_evaluation_file", warning=True)
def recipe_evaluation_file(raw: dict[str, Any], given: dict[str, Any], key: str) -> str | None:
    """A train_file of the user's own beside the recipe's validation_file or test_file from another folder:
    kept (a bigger training file of the same data is a fair use), with the fix, since scoring one data
    set's model on another's test set is rarely what was meant."""
    train, theirs = given.get("train_file"), raw.get(key)
    if not isinstance(train, str) or key in given or not isinstance(theirs, str):
        return None
    if Path(theirs).expanduser().resolve().parent != Path(train).expanduser().resolve().parent:
        return f"train_file is yours but {key} is the recipe's ({theirs}); set {key}=<your file>, or {key}=null to leave it out"
    return None


# The recipe's caps on a split's samples, and the data keys whose data each cuts (settings.recipe_sample_cap).
SAMPLE_CAPS = {"max_train_samples": "train_file", "max_eval_samples": "validation_file", "max_test_samples": "test_file"}


@rule("settings.recipe_sample_cap", warning=True)
def recipe_sample_cap(raw: dict[str, Any], given: dict[str, Any], key: str) -> str | None:
    """A streamed run's data file of the user's own (train_file, validation_file, test_file) cut by the recipe's
    cap on that split (max_train_samples=2400 of the default recipe, written for its own data), the cap not
    given on the command line: a loaded run's start summary counts the samples kept, a stream's counts its
    steps, and each pass repeats the first rows without a sign."""
    file, cap = SAMPLE_CAPS.get(key), raw.get(key)
    mine, theirs = given.get(file), raw.get(file)
    streamed = str(given.get("streaming", raw.get("streaming"))).lower() == "true"
    if not streamed or not isinstance(cap, int) or key in given or not isinstance(mine, str) or mine == theirs:
        return None
    if isinstance(theirs, str) and Path(theirs).expanduser().resolve() == Path(mine).expanduser().resolve():
        return None
    return (f"{file} is yours but {key}={cap:,} is the recipe's, written for its own data: a longer file is cut to "
            f"its first {cap:,} samples; set {key}=null to read all of it, or a number of your own")


MODEL_OVER_COMMAND_LINE = [model_config_beside_name]
RECIPE_OVER_COMMAND_LINE = [recipe_evaluation_file, recipe_sample_cap]
