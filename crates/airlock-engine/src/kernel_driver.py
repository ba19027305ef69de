# airlock kernel session driver. Runs inside the session's sandbox, with the calls' code:
# nothing here is trusted by the host, which reads what it writes as job output.
import ast
import json
import os
import signal
import sys
import time
import traceback

D = "/work/.airlock"
VALUE_MAX = 8000


class CallTimeout(BaseException):
    """Raised in the call when its wall time is up."""


def _alarm(signum, frame):
    raise CallTimeout("the call reached its wall time")


def _run(code, env):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), env)
    if last is not None:
        return eval(compile(last, "<cell>", "eval"), env)
    return None


def _open(path):
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)


def main():
    signal.signal(signal.SIGALRM, _alarm)
    env = {"__name__": "__main__", "__builtins__": __builtins__}
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    n = max(n, 1)
    os.makedirs(D, exist_ok=True)
    os.close(_open(D + "/ready"))
    while True:
        go = "%s/call-%d.go" % (D, n)
        try:
            with open(go) as f:
                timeout = float(f.read().strip() or "5")
        except FileNotFoundError:
            time.sleep(0.005)
            continue
        with open("%s/call-%d.py" % (D, n), "rb") as f:
            code = f.read().decode("utf-8", "replace")
        sys.stdout.flush()
        sys.stderr.flush()
        out = _open("%s/out-%d.stdout" % (D, n))
        err = _open("%s/out-%d.stderr" % (D, n))
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        res = {"status": "ok", "value": None, "error": None}
        try:
            signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
            try:
                value = _run(code, env)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if value is not None:
                res["value"] = repr(value)[:VALUE_MAX]
        except CallTimeout:
            res["status"] = "timeout"
            print("the call reached its wall time and was interrupted", file=sys.stderr)
        except BaseException as e:
            res["status"] = "error"
            res["error"] = {"name": type(e).__name__, "value": str(e)[:2000]}
            # The traceback from the cell's own frames on: the driver's are noise.
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb or e.__traceback__)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        fd = _open("%s/res-%d.json" % (D, n))
        os.write(fd, json.dumps(res).encode())
        os.close(fd)
        os.close(_open("%s/res-%d.done" % (D, n)))
        n += 1


main()
