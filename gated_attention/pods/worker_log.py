"""Run a command on a worker and keep a copy of its output in the bucket as it runs.

    python -m gated_attention.pods.worker_log --dest gs://b/runs/NAME/logs \
        --name worker-{worker}.log [--every 30] -- python -m gated_attention.main ...

Each attempt (each start of this wrapper) writes its own object, never another's:
DEST/worker-3.<start time>.<host>.<pid>.log for `--name worker-{worker}.log` on worker 3.
A relaunch, a JobSet restart or a second launch running beside the first therefore adds its
log beside the earlier ones; a rewrite of one shared object could lose an attempt's lines
(two attempts alive at once, or a bucket that failed to answer the read). The start time
sorts the attempts: `attempts()` lists them in order and `read_all()` joins them, as
`gcloud storage cat 'DEST/worker-3.*.log'` does.

The command's stdout and stderr go to this process's stdout and to a local file, copied to
the attempt's object every `--every` seconds (30: the bucket is at most a minute behind,
a slow copy included) and once more when the command has ended, after a last line
`### exit N` with its exit code. SIGTERM, SIGINT and SIGHUP are passed on to the command,
which is then waited for: a trainer that saves on SIGTERM has saved before that line is
written (128 + N when a signal N ended it, as the shell counts). `{worker}` in NAME is the
worker's number (TPU_WORKER_ID, else CLOUD_TPU_TASK_ID, else the host name).
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

from gated_attention.cli import flags as cli_flags
from gated_attention.core import paths

WORKER_ENV = ("TPU_WORKER_ID", "CLOUD_TPU_TASK_ID")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
DEFAULT_LOCAL = "~/.cache/gated_attention/worker_logs"
DEFAULT_EVERY_S = 30.0
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


def attempt_name(name: str, start: datetime.datetime, host: str, pid: int) -> str:
    """`worker-3.log` -> `worker-3.20261204T165000.123456Z.host.1234.log`: fixed-width UTC
    time first, so the names of one log's attempts sort in the order they started."""
    stem, dot, suffix = name.rpartition(".")
    stem, suffix = (stem, f".{suffix}") if dot else (name, "")
    stamp = start.astimezone(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{stem}.{stamp}.{host.replace('/', '_')}.{pid}{suffix}"


def attempts(dest: paths.PathLike, name: str) -> list[str]:
    """The objects of every attempt of log `name` (its {worker} filled in) under `dest`,
    oldest first."""
    stem, dot, suffix = name.rpartition(".")
    stem, suffix = (stem, f".{suffix}") if dot else (name, "")
    folder = os.fspath(paths.resolve(dest)).rstrip("/")
    if paths.is_local(folder):
        names = os.listdir(folder) if os.path.isdir(folder) else []
    else:  # one fresh listing: other processes write these objects
        import fsspec

        fs, key = fsspec.core.url_to_fs(folder)
        fs.invalidate_cache()
        names = [p.rsplit("/", 1)[-1] for p in fs.glob(f"{key}/{stem}.*{suffix}")]
    return sorted(f"{folder}/{n}" for n in names
                  if n.startswith(f"{stem}.") and n.endswith(suffix)
                  and n[len(stem) + 1:len(stem) + 2].isdigit())


def read_all(dest: paths.PathLike, name: str) -> str:
    """Every attempt's log of `name`, oldest first, as one text."""
    return "".join(paths.read_current(path) for path in attempts(dest, name))


class LogCopier:
    """Keeps one attempt's object equal to its local log (no other object is written)."""

    def __init__(self, local: str, remote: paths.PathLike) -> None:
        self.local, self.remote = local, paths.resolve(remote)
        self._lock = threading.Lock()

    def copy(self) -> bool:
        with self._lock, open(self.local, "rb") as f:
            data = f.read()
            try:
                self.remote.parent.mkdir(parents=True, exist_ok=True)
                self.remote.write_bytes(data)
                return True
            except Exception as err:  # noqa: BLE001 - retried at the next copy
                print(f"worker_log: could not copy to {self.remote} ({err}); will retry",
                      file=sys.stderr, flush=True)
                return False


def _exit_code(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def run(command: Sequence[str], dest: str, name: str, every: float = DEFAULT_EVERY_S,
        local_dir: str = DEFAULT_LOCAL) -> int:
    """Run `command` with its log copied to this attempt's object under `dest`; its exit
    code (128 + N for a signal N)."""
    start = datetime.datetime.now(datetime.UTC)
    host = socket.gethostname()
    own = attempt_name(name.replace("{worker}", worker_name()), start, host, os.getpid())
    local_folder = os.path.abspath(os.path.expanduser(local_dir))
    os.makedirs(local_folder, exist_ok=True)
    local = os.path.join(local_folder, own)
    copier = LogCopier(local, f"{dest.rstrip('/')}/{own}")
    with open(local, "wb") as out:
        out.write(f"### {start.isoformat(timespec='seconds')} {host}: "
                  f"{' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for signum in FORWARDED:  # passed on; the command decides when it ends
            signal.signal(signum, lambda s, _f: proc.send_signal(s))
        done = threading.Event()

        def copy_every() -> None:
            while not done.wait(every):
                copier.copy()

        threading.Thread(target=copy_every, daemon=True).start()
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
        rc = _exit_code(proc.wait())
        # A process the command left behind may hold its output open: do not wait for it.
        pumping.join(timeout=5.0)
        done.set()
        with lock:
            out.write(f"{EXIT_LINE}{rc}\n".encode())
            out.close()
    copier.copy()
    return rc


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("dest", None, "Folder for the log (gs:// or local).",
                        flag_values=flag_values)
    flags.DEFINE_string("name", None, "File name; {worker} = worker number.",
                        flag_values=flag_values)
    flags.DEFINE_float("every", DEFAULT_EVERY_S, "Seconds between copies.",
                       flag_values=flag_values)
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
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
