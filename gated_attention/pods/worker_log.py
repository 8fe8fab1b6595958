"""Run a command on a TPU worker and keep a copy of its output in the bucket as it runs.

    python -m gated_attention.pods.worker_log --dest gs://b/runs/NAME/logs \
        --name worker-{worker}.log [--every 60] -- python -m gated_attention.main ...

The command's stdout and stderr go to this process's stdout and to a local file; that file
is copied to DEST/NAME every `--every` seconds and when the command ends, so a preempted
VM's log is in the bucket up to the last copy. `{worker}` in NAME is the worker's number
(TPU_WORKER_ID, else CLOUD_TPU_TASK_ID, else the host name). A log already at DEST/NAME
(an earlier attempt's) is kept: this attempt's output is added after it. SIGTERM, SIGINT
and SIGHUP are passed on to the command (a preempted VM's SIGTERM must reach main.py);
the exit code is the command's (128 + N when a signal N ended it).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

from absl import flags

from gated_attention import cli_flags, paths

WORKER_ENV = ("TPU_WORKER_ID", "CLOUD_TPU_TASK_ID")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_LOCAL = "~/.cache/gated_attention/worker_logs"
EXIT_LINE = "### exit "  # begins an attempt's last line, written once its command ended


def worker_name(env: Mapping[str, str] | None = None) -> str:
    """This worker's number, else the host name (a value holding spaces is libtpu's
    placeholder sentence, not a number)."""
    env = os.environ if env is None else env
    for key in WORKER_ENV:
        value = env.get(key, "").strip()
        if value and not any(c.isspace() for c in value):
            return value
    return socket.gethostname()


class LogCopier:
    """Keeps DEST/NAME equal to (what it held before this attempt) + the local log."""

    def __init__(self, local: str, remote: paths.PathLike) -> None:
        self.local, self.remote = local, paths.resolve(remote)
        self._lock = threading.Lock()
        try:
            self.before = self.remote.read_bytes() if self.remote.exists() else b""
        except Exception as err:  # noqa: BLE001 - a log copy must never stop the run
            print(f"worker_log: cannot read {self.remote} ({err})", file=sys.stderr)
            self.before = b""

    def copy(self) -> bool:
        with self._lock, open(self.local, "rb") as f:
            data = f.read()
            try:
                self.remote.parent.mkdir(parents=True, exist_ok=True)
                self.remote.write_bytes(self.before + data)
                return True
            except Exception as err:  # noqa: BLE001 - retried at the next copy
                print(f"worker_log: could not copy to {self.remote} ({err}); will retry",
                      file=sys.stderr, flush=True)
                return False


def run(command: Sequence[str], dest: str, name: str, every: float = 60.0,
        local_dir: str = DEFAULT_LOCAL) -> int:
    name = name.replace("{worker}", worker_name())
    local_folder = os.path.abspath(os.path.expanduser(local_dir))
    os.makedirs(local_folder, exist_ok=True)
    local = os.path.join(local_folder, name)
    copier = LogCopier(local, f"{dest.rstrip('/')}/{name}")
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with open(local, "wb") as out:
        out.write(f"### {stamp} {socket.gethostname()}: {' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for signum in FORWARDED:
            signal.signal(signum, lambda s, _f: proc.send_signal(s))
        done = threading.Event()

        def copy_every() -> None:
            while not done.wait(every):
                copier.copy()

        copying = threading.Thread(target=copy_every, daemon=True)
        copying.start()
        assert proc.stdout is not None
        lock = threading.Lock()

        def pump() -> None:  # a thread: the main one waits for the command (and signals)
            for line in iter(proc.stdout.readline, b""):
                with lock:
                    if out.closed:
                        return
                    out.write(line)
                    out.flush()
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()

        pumping = threading.Thread(target=pump, daemon=True)
        pumping.start()
        rc = proc.wait()
        # A process the command left behind may hold its output open: do not wait for it.
        pumping.join(timeout=5.0)
        done.set()
        with lock:
            out.write(f"{EXIT_LINE}{rc if rc >= 0 else 128 - rc}\n".encode())
            out.close()
    copier.copy()
    return rc if rc >= 0 else 128 - rc


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("dest", None, "Folder for the log (gs:// or local).",
                        flag_values=flag_values)
    flags.DEFINE_string("name", None, "File name; {worker} = worker number.",
                        flag_values=flag_values)
    flags.DEFINE_float("every", 60.0, "Seconds between copies.", flag_values=flag_values)
    flags.DEFINE_string("local", DEFAULT_LOCAL, "Folder of the local log.",
                        flag_values=flag_values)
    flags.mark_flags_as_required(["dest", "name"], flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The flags before `--` are ours, the command after it is run as given.
    split = argv.index("--") if "--" in argv else len(argv)
    cli = cli_flags.Command("worker_log", __doc__)
    args = cli.parse(define_flags(flags.FlagValues()), argv[:split])
    command = argv[split + 1:]
    if not command:
        cli.error("give the command after `--`")
    if args.every <= 0:
        cli.error(f"--every={args.every} must be a positive number of seconds")
    if "/" in args.name.replace("{worker}", ""):
        cli.error(f"--name={args.name} must be a file name, not a path")
    return run(command, args.dest, args.name, args.every, args.local)


if __name__ == "__main__":
    sys.exit(main())
