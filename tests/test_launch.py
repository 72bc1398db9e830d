"""finetune-launch: `accelerate launch` whose mistakes are one line and exit 2, whose exit status is
the training processes', and whose signals reach training. Plus plain `accelerate launch`: killing
its launcher still makes the training process save a checkpoint (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    REPO,
    launch_command,
    logged_steps,
    one_error_line,
    tiny_text_args,
    user_error,
    wait_until,
)

from finetune import checkpoint as ckpt
from finetune import checks

FINETUNE_LAUNCH = [sys.executable, "-m", "finetune.launch"]  # bare: for mistakes found before launching


def _run(cmd: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "FINETUNE_SHOW_RULES": "1"}  # `[rule.id]` in each error line
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _one_error_line(result: subprocess.CompletedProcess, *words: str, rule: str | None = None) -> None:
    """The one error line; given `rule`, said by it (`error: [rule] ...`)."""
    line = one_error_line(result.returncode, result.stderr, *words)
    assert rule is None or line.startswith(f"error: [{rule}] "), (line, rule)


# Mistakes found before anything is launched, asked of `finetune.launch.main` in-process (each real command
# would start an interpreter that imports accelerate and torch, seconds on the 2-core machine); the real
# command's own exit status 2 and one line: test_missing_script_is_one_line and the two-process test below.
def _launch_error(capsys, argv: list[str], *fragments: str, rule: str) -> str:
    from finetune.launch import main as launch_main

    return user_error(capsys, launch_main, argv, *fragments, rule=rule)


def test_missing_accelerate_config_is_one_line(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    _launch_error(capsys, ["--config_file", str(missing), str(REPO / "finetune/run.py")], str(missing),
                  rule="launch.config_not_found")  # fmt: skip


def test_unparsable_accelerate_config_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: [NO\n")
    _launch_error(capsys, ["--config_file", str(bad), str(REPO / "finetune/run.py")], str(bad), "not a valid",
                  rule="launch.config_invalid")  # fmt: skip


def test_a_multi_cpu_config_of_several_processes_without_mpirun_is_one_line(tmp_path, capsys):
    """accelerate starts MULTI_CPU's processes through mpirun only: without it, one process trains alone."""
    config = tmp_path / "ddp3.yaml"
    config.write_text((REPO / "accelerate_configs/cpu.yaml").read_text().replace("distributed_type: 'NO'",
                      "distributed_type: MULTI_CPU").replace("num_processes: 1", "num_processes: 3"))  # fmt: skip
    _launch_error(capsys, ["--config_file", str(config), str(REPO / "finetune/run.py")],
                  "asks for MULTI_CPU with 3 processes", "accelerate_configs/cpu_ddp.yaml",
                  rule="launch.multi_cpu_without_mpirun")
    # the same count with distributed_type NO (the default config edited by hand): one process too
    alone = tmp_path / "no4.yaml"
    alone.write_text((REPO / "accelerate_configs/cpu.yaml").read_text().replace("num_processes: 1", "num_processes: 4"))
    _launch_error(capsys, ["--config_file", str(alone), str(REPO / "finetune/run.py")],
                  "num_processes 4 (in accelerate config", "with distributed_type NO", "cpu_ddp.yaml",
                  rule="launch.processes_without_distribution")  # fmt: skip


def test_one_process_of_several_started_alone_by_plain_accelerate_launch_says_so(small_text_data, tmp_path,
                                                                                 monkeypatch, capsys):  # fmt: skip
    """Plain `accelerate launch` with that MULTI_CPU config starts one process with the environment of its
    one-process launcher (ACCELERATE_USE_CPU, and MASTER_ADDR because several were asked for) and no
    rank: the run says it trains alone."""
    from finetune.config import load_config
    from finetune.runtime import _one_of_several_started_alone, make_accelerator

    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    said = checks.Said()
    make_accelerator(load_config(None, tiny_text_args(small_text_data, tmp_path / "r")), said)  # as the run builds it
    assert "started this one alone, so it trains in one process" in capsys.readouterr().err
    assert said.rules() == ["launch.started_alone"]
    assert _one_of_several_started_alone()
    monkeypatch.setenv("RANK", "0")  # started by torchrun or mpirun: nothing to say
    assert not _one_of_several_started_alone()


def test_missing_script_is_one_line(tmp_path):
    _one_error_line(_run([*launch_command(launcher="finetune.launch"), "finetune/runn.py"], tmp_path), "finetune/runn.py",
                    rule="launch.no_script")  # fmt: skip


@pytest.mark.slow  # ~8 s; test_a_user_error_under_two_processes_is_one_line_and_exit_2 keeps exit 2 through the launcher
def test_a_user_error_keeps_its_exit_status_through_the_launcher(tmp_path):
    """accelerate launch turns the process's exit 2 into exit 1 and a CalledProcessError traceback."""
    result = _run([*launch_command(launcher="finetune.launch"), "finetune/run.py", "bogus_key=1"], tmp_path)
    _one_error_line(result, "bogus_key")
    plain = _run([*launch_command(), "finetune/run.py", "bogus_key=1"], tmp_path)
    assert plain.returncode == 1 and "CalledProcessError" in plain.stderr  # what the wrapper fixes
    # accelerate's own quiet mode (one process only): the app's line alone, but exit status 1
    quiet = _run([*launch_command(), "-q", "finetune/run.py", "bogus_key=1"], tmp_path)
    assert quiet.returncode == 1 and quiet.stderr.splitlines() == [
        "error: [settings.unknown_key] unknown config key 'bogus_key'"  # _run shows each line's rule
    ], quiet.stderr[-2000:]


def test_a_user_error_under_two_processes_is_one_line_and_exit_2(tmp_path):
    """torchrun: both ranks exit 2; rank 0 says why; no ChildFailedError traceback, no torchrun log lines."""
    result = _run([*launch_command(2, launcher="finetune.launch"), "finetune/run.py", "bogus_key=1"], tmp_path)
    _one_error_line(result, "bogus_key")
    assert "ChildFailedError" not in result.stderr and "exitcode" not in result.stderr, result.stderr[-2000:]


@pytest.mark.slow  # ~12 s; test_a_user_error_under_two_processes_is_one_line_and_exit_2 keeps two processes' one line
def test_a_data_mistake_under_two_processes_is_one_line(small_text_data, tmp_path):
    """A mistake found while the main process reads the data first (a wrong text_column) while the
    other waits for it: one line from the process that met it, no gloo traceback from the other."""
    out = tmp_path / "run"
    args = tiny_text_args(small_text_data, out, "text_column=txt")
    result = _run([*launch_command(2, launcher="finetune.launch"), "finetune/run.py", *args], tmp_path)
    _one_error_line(result, "column 'txt' not found in the train data")
    assert "gloo" not in result.stderr and "Connection closed" not in result.stderr, result.stderr[-2000:]
    assert not (out / "config.yaml").exists()


@pytest.fixture
def started():
    """The long runs a test starts; whatever still runs at the end (a failed assert) is killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(proc.pid)
            for p in [*tree.children(recursive=True), tree]:
                p.kill()
        proc.wait(timeout=30)


def _ended(process: psutil.Process, timeout: float) -> None:
    """Wait for a process that is not our child: gone, or a zombie nobody reaps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    raise AssertionError(f"process {process.pid} still runs after {timeout} s")


def _start_long_run(launcher: str, data: dict, out: Path, log: Path, new_group: bool = False) -> subprocess.Popen:
    args = tiny_text_args(data, out, "num_train_epochs=1000", "per_device_train_batch_size=4")
    return subprocess.Popen(
        [*launch_command(launcher=launcher), str(REPO / "finetune/run.py"), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.with_suffix(".err").open("w"),
        start_new_session=new_group,  # its own process group, as a shell gives a foreground job
    )


@pytest.mark.parametrize(
    "sig, status, group",
    [pytest.param(signal.SIGTERM, 143, False, marks=pytest.mark.slow),  # ~9 s; tests/test_signals.py in-process
     pytest.param(signal.SIGINT, 130, False, marks=pytest.mark.slow),
     pytest.param(signal.SIGINT, 130, True, marks=pytest.mark.slow)],  # fmt: skip
    ids=["sigterm-to-launcher", "sigint-to-launcher", "ctrl-c-to-the-group"],
)
def test_a_signal_to_the_launcher_saves_a_checkpoint_and_is_its_exit_status(
    small_text_data, tmp_path, sig, status, group, started
):
    """To the launcher alone, as `kill` or a scheduler sends it, or to the whole process group, as Ctrl-C
    does: the training process then gets it twice (directly and forwarded), which is one request."""
    out = tmp_path / "run"
    proc = _start_long_run("finetune.launch", small_text_data, out, tmp_path / "log", new_group=group)
    started.append(proc)
    wait_until(lambda: logged_steps(out) >= 2, proc, timeout=180)
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    assert proc.wait(timeout=120) == status
    err = (tmp_path / "log.err").read_text()
    assert "Traceback" not in err, err[-2000:]
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and sig.name in stopped[0], err[-2000:]
    assert len(ckpt.list_checkpoints(out)) == 1


@pytest.mark.slow
def test_killing_a_plain_accelerate_launcher_still_saves_a_checkpoint(small_text_data, tmp_path, started):
    """accelerate's one-process launcher does not forward SIGTERM; the training process asked the kernel
    for SIGTERM when its parent dies, so it saves a checkpoint and stops on its own."""
    out = tmp_path / "run"
    launcher = _start_long_run("accelerate.commands.launch", small_text_data, out, tmp_path / "log")
    started.append(launcher)
    wait_until(lambda: logged_steps(out) >= 2, launcher, timeout=180)
    (trainer,) = psutil.Process(launcher.pid).children()
    launcher.send_signal(signal.SIGKILL)  # the harshest launcher death: no handler of its own runs
    launcher.wait(timeout=30)
    _ended(trainer, timeout=120)  # not our child: its status is not ours to read; its message is
    err = (tmp_path / "log.err").read_text()
    stopped = [line for line in err.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "SIGTERM" in stopped[0], err[-2000:]
    assert len(ckpt.list_checkpoints(out)) == 1


@pytest.mark.parametrize("rank", [0, 1])
def test_agreed_the_first_process_that_failed_says_it_the_others_end_quietly(monkeypatch, rank):
    """`runtime.agreed` on a process of two, given what the processes report (the gather, faked here;
    the real one under two processes: the test above): its own error when it is the first that
    failed, marked as its own to say; PeerFailed when another failed first; nothing when none did."""
    import types

    import accelerate.utils

    from finetune.errors import PeerFailed, UserError
    from finetune.runtime import agreed

    accelerator = types.SimpleNamespace(num_processes=2, process_index=rank, is_main_process=rank == 0)

    def run(reports: list[bool], fail: bool) -> None:
        monkeypatch.setattr(accelerate.utils, "gather_object", lambda mine: reports)
        with agreed(accelerator):
            if fail:
                raise UserError("the disk is full")

    run([False, False], fail=False)  # none failed: the block's end is all
    with pytest.raises(UserError, match="the disk is full") as own:
        run([i == rank for i in range(2)], fail=True)
    assert not isinstance(own.value, PeerFailed) and own.value.local
    other = 1 - rank
    with pytest.raises(PeerFailed, match=f"process {other} failed"):
        run([i == other for i in range(2)], fail=False)
    with pytest.raises(PeerFailed if rank == 1 else UserError):  # both failed: process 0 says it
        run([True, True], fail=True)


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_in_the_first_second_is_one_stopped_line(tmp_path, sig, status):
    """Ctrl-C while Python still imports torch and transformers: one `stopped:` line, no
    KeyboardInterrupt traceback, nothing written."""
    proc = subprocess.Popen([sys.executable, str(REPO / "finetune/run.py"), f"output_dir={tmp_path / 'o'}"],
                            cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(0.5)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-2000:]
    assert "Traceback" not in err and [line for line in err.splitlines() if line.startswith("stopped:")], err
    assert not (tmp_path / "o").exists()


def test_finetune_launch_bad_flag_is_one_line(capsys):
    from finetune.launch import main as launch_main

    with pytest.raises(SystemExit) as exit_info:
        launch_main(["--bogus-flag", str(REPO / "finetune/run.py")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bogus-flag" in err[0], err  # no usage page
    assert exit_info.value.__context__.rule == "launch.usage"


def test_the_set_up_config_launches_without_accelerates_notice_and_is_written_once(tmp_path, capsys):
    """finetune-config writes accelerate's default config, with the threads per process that accelerate
    launch otherwise prints a notice about on a CPU; a second call leaves the file as it is."""
    from finetune.launch import configure

    path = tmp_path / "accelerate" / "default_config.yaml"
    assert configure(["--config_file", str(path)]) == 0
    assert "wrote accelerate's default config" in capsys.readouterr().out
    written = path.read_bytes()
    plain = [sys.executable, "-m", "accelerate.commands.launch"]  # no flags: the config alone
    out = subprocess.run([*plain, "--config_file", str(path), "finetune/run.py", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "usage: finetune/run.py" in out.stdout
    assert "were not passed to `accelerate launch`" not in out.stdout + out.stderr
    configure(["--config_file", str(path)])
    assert "exists; left as it is" in capsys.readouterr().out and path.read_bytes() == written
    # one that does not parse (a tab in its YAML): said now, not at the next launch, and left as it is
    path.write_text("compute_environment: LOCAL_MACHINE\n\tdistributed_type: NO\n")
    line = user_error(capsys, configure, ["--config_file", str(path)], rule="launch.default_config_invalid")
    assert f"accelerate config {path} exists but is not a valid accelerate config" in line
    assert "fix it, or move it aside" in line and "delete" not in line
    assert path.read_text().startswith("compute_environment")
    # one that parses, with a value no launch can use: said by finetune-config, and by a launch without a traceback
    path.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: two\nuse_cpu: true\n")
    line = user_error(capsys, configure, ["--config_file", str(path)], rule="launch.default_config_invalid")
    assert "num_processes 'two' (in accelerate config" in line and "is not a whole number" in line
    from finetune.launch import main as launch_main

    line = user_error(capsys, launch_main, ["--config_file", str(path), "finetune/run.py", "--dry-run"],
                      rule="launch.not_a_whole_number")  # fmt: skip
    assert "num_processes 'two' (in accelerate config" in line


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("train.csv", "text,label\nfine film,1\ndull,0\n", "is not a YAML mapping of settings, not an accelerate config"),
        ("rows.json", '{"text": "fine"}\n{"text": "dull"}\n', "is not valid JSON, not an accelerate config"),
        ("recipe.yaml", (REPO / "finetune/configs/bert_custom_files.yaml").read_text(),
         "without any of accelerate's keys (compute_environment, distributed_type, ...), not an accelerate config"),
        ("notes.yaml", "todo: [fix the data\n", "is not valid YAML, not an accelerate config"),
        ("empty.yaml", "", "is empty, not an accelerate config"),
        ("picture.yaml", b"\x89PNG\r\n\x1a\n\xff\xfe", "is not text, not an accelerate config"),
    ],
)
def test_finetune_config_on_a_file_that_is_no_accelerate_config_leaves_it_without_advising_to_delete_it(
        tmp_path, capsys, name, content, fragment):  # fmt: skip
    """finetune-config --config_file naming the user's file (data, a recipe, notes) says what the file is, and
    offers another path or `accelerate config`, never deleting it; the file keeps its bytes."""
    from finetune.launch import configure

    mine = tmp_path / "mine"
    mine.mkdir()
    path = mine / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    line = user_error(capsys, configure, ["--config_file", str(path)], f"{path} is ", fragment,
                      "and is left as it is; give --config_file a new path", "or write one with `accelerate config`",
                      untouched=mine, rule="launch.default_config_not_accelerate")  # fmt: skip
    assert "delete" not in line


def test_finetune_config_on_a_folder_is_one_line_of_its_own(tmp_path, capsys):
    """A folder as finetune-config's --config_file (one of the user's data): said as a folder, not as a config
    that "does not exist" in accelerate's words cut off mid-line, and never to be deleted."""
    from finetune.launch import configure

    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.csv").write_text("text,label\nfine film,1\n")
    line = user_error(capsys, configure, ["--config_file", str(folder)],
                      f"{folder} is a folder; --config_file names a YAML file: give the path of the file to write, "
                      f"e.g. {folder / 'accelerate.yaml'}", untouched=folder, rule="launch.default_config_is_a_folder")  # fmt: skip
    assert "delete" not in line and "does not exist" not in line
    assert configure(["--config_file", str(folder / "accelerate.yaml")]) == 0  # as the line says
    assert "wrote accelerate's default config" in capsys.readouterr().out


def test_a_recipe_and_an_accelerate_config_swapped_are_named(capsys):
    """A recipe given as the accelerate config, and an accelerate config given as the recipe: each line
    says which file goes where, not which key the file lacks."""
    from finetune.config import load_config
    from finetune.errors import UserError
    from finetune.launch import main as launch_main

    recipe = REPO / "finetune/configs/bert_custom_files.yaml"
    line = user_error(capsys, launch_main, ["--config_file", str(recipe), "finetune/run.py"], rule="launch.config_is_a_recipe")
    assert "is a finetune recipe, not an accelerate config: pass it to finetune/run.py as --config" in line
    # the recipe's own option before the script: the launcher does not know it
    for before in (["--config", str(recipe)], [f"--config={recipe}"]):
        line = user_error(capsys, launch_main, [*before, "finetune/run.py"], rule="launch.recipe_flag")
        assert "--config (the recipe) is finetune/run.py's option: put it after the script" in line
    with pytest.raises(UserError, match="that file is an accelerate config; pass it to accelerate launch "
                                        "--config_file") as raised:
        load_config(REPO / "accelerate_configs/cpu.yaml")
    assert raised.value.rule == "settings.accelerate_config_as_recipe"


ACCELERATE_CPU = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "num_machines": 1,
                  "machine_rank": 0, "num_processes": 1, "use_cpu": True, "mixed_precision": "no"}  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "changes", "flags", "fragment"),
    [
        ("launch.config_is_a_folder", "<folder>", [], "is a folder; pass the config file"),
        ("launch.fsdp_with_cpu", {"distributed_type": "FSDP", "use_cpu": False}, ["--cpu"], "--cpu would train without it"),
        ("launch.deepspeed_config", {"distributed_type": "DEEPSPEED", "use_cpu": False,
                                     "deepspeed_config": {"zero_stage": 2}}, [], "asks for DeepSpeed"),
        ("launch.not_a_whole_number", {"num_machines": 1.5}, [], "num_machines 1.5 (in accelerate config"),
        ("launch.num_processes", {"num_processes": 0}, [], "num_processes must be at least 1, got 0"),
        ("launch.num_machines", {}, ["--num_machines", "0"], "num_machines must be at least 1, got 0 (--num_machines)"),
        ("launch.machine_rank", {"num_machines": 2, "machine_rank": 2}, [], "is not one of the 2 machines: give 0 to 1"),
        ("launch.main_process_port", {"main_process_port": 70000}, [], "is not a port"),
        ("launch.mixed_precision", {"mixed_precision": "fp8x"}, [], "mixed_precision 'fp8x'"),
        ("launch.dynamo_backend", {"dynamo_config": {"dynamo_backend": "BOGUS"}}, [], "dynamo_backend 'BOGUS'"),
    ],
)
def test_each_launcher_rule_is_one_line_before_anything_starts(rule, changes, flags, fragment, tmp_path, capsys):
    """The launcher's rules (finetune/checks/launch.py), each met by the config or flag it names, before a
    process starts (tests/test_bad_input.py holds more cases of them)."""
    import yaml

    from finetune.launch import main as launch_main

    config = tmp_path / "accelerate.yaml"
    if changes == "<folder>":
        config.mkdir()
    else:
        config.write_text(yaml.safe_dump({**ACCELERATE_CPU, **changes}))
    script = tmp_path / "would_train.py"
    script.write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    user_error(capsys, launch_main, ["--config_file", str(config), *flags, str(script)], fragment, rule=rule)
    assert not (tmp_path / "started").exists()


def test_a_default_config_that_cannot_be_written_is_one_line(tmp_path, capsys):
    from finetune.launch import configure

    (tmp_path / "a-file").write_text("")
    line = user_error(capsys, configure, ["--config_file", str(tmp_path / "a-file" / "default_config.yaml")],
                      "cannot write accelerate's config", rule="launch.cannot_write_config")  # fmt: skip
    assert "a-file" in line
