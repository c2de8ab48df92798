"""Cold-start init time of a gitstate-lambda binary under cargo-lambda's runtime emulator:
process start to the first response, for GET /health (no git request).

    python tests/tools/cold-start.py target/debug/gitstate-lambda [runs]

`cargo lambda watch --only-lambda-apis` serves the runtime API; a Function URL request is sent
first and waits for a function; then the binary is started and timed until the response arrives.
The repository setting points at a closed port: /health never touches it.
"""

import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, limit=30):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("cargo lambda watch is not listening")


def one_run(binary, port, cache):
    done = {}

    def request():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lambda-url/_/health", timeout=30) as r:
            r.read()
            done["status"] = r.status
            done["at"] = time.monotonic()

    waiter = threading.Thread(target=request)
    waiter.start()
    time.sleep(0.3)  # the request is queued in the emulator before the function exists
    env = dict(
        os.environ,
        AWS_LAMBDA_RUNTIME_API=f"http://127.0.0.1:{port}/.rt",
        AWS_LAMBDA_FUNCTION_NAME="_",
        AWS_LAMBDA_FUNCTION_VERSION="1",
        AWS_LAMBDA_FUNCTION_MEMORY_SIZE="1024",
        GITSTATE_REPOSITORY="http://127.0.0.1:9/state.git",
        GITSTATE_CACHE_DIR=cache,
        RUST_LOG="warn",
    )
    started = time.monotonic()
    function = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    waiter.join()
    function.terminate()
    function.wait()
    if done.get("status") != 200:
        raise SystemExit(f"no 200 from /health: {done}")
    return (done["at"] - started) * 1000


def main():
    binary = os.path.abspath(sys.argv[1])
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    cargo_lambda = shutil.which("cargo-lambda") or "tests/tools/deploy-venv/bin/cargo-lambda"
    port = free_port()
    watch = subprocess.Popen(
        [cargo_lambda, "lambda", "watch", "--only-lambda-apis", "-A", "127.0.0.1", "-P", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        wait_listening(port)
        with tempfile.TemporaryDirectory() as cache:
            times = [one_run(binary, port, cache) for _ in range(runs)]
    finally:
        os.killpg(watch.pid, signal.SIGKILL)
        watch.wait()
    print(f"{binary}: {os.path.getsize(binary)} bytes; init to first response over {runs} runs: "
          f"median {statistics.median(times):.1f} ms, min {min(times):.1f} ms, max {max(times):.1f} ms")


if __name__ == "__main__":
    main()
