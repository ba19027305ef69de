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
# A call's charts and its value's HTML go into D/files-N/, which the host releases like a
# job's /out (its caps, its secret scan); these bound what the driver itself writes.
FIGURES_MAX = 16
HTML_MAX = 256 * 1024

# Figures render off-screen, whatever the code asks for: there is no display.
os.environ["MPLBACKEND"] = "Agg"


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


def _save_figures(files):
    """Saves the figures left open at the end of a call as PNGs, then closes them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        numbers = list(plt.get_fignums())
    except Exception:
        return
    for index, number in enumerate(numbers[:FIGURES_MAX], 1):
        try:
            plt.figure(number).savefig("%s/figure-%d.png" % (files, index), format="png")
        except Exception as e:
            print("figure %d was not saved: %s" % (number, e), file=sys.stderr)
    if len(numbers) > FIGURES_MAX:
        print("%d figures were open; the first %d were saved" % (len(numbers), FIGURES_MAX),
              file=sys.stderr)
    try:
        plt.close("all")
    except Exception:
        pass


def _save_html(files, value):
    """Writes the value's HTML (a DataFrame's table), when it has one, bounded."""
    to_html = getattr(type(value), "_repr_html_", None)
    if to_html is None:
        return
    try:
        html = to_html(value)
    except Exception as e:
        print("the value's HTML was not made: %s" % e, file=sys.stderr)
        return
    if not isinstance(html, str):
        return
    data = html.encode("utf-8", "replace")[:HTML_MAX]
    fd = _open("%s/value.html" % files)
    os.write(fd, data)
    os.close(fd)


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
                order = json.load(f)
        except FileNotFoundError:
            time.sleep(0.005)
            continue
        timeout = float(order.get("timeout", 5))
        want_html = bool(order.get("html", False))
        files = "%s/files-%d" % (D, n)
        try:
            os.mkdir(files, 0o700)
        except FileExistsError:
            pass
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
                if want_html:
                    _save_html(files, value)
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
        # A call that failed still shows what it drew; one cut at its wall time does not
        # get more time to save.
        if res["status"] != "timeout":
            try:
                _save_figures(files)
            except BaseException as e:
                print("figures were not saved: %s" % e, file=sys.stderr)
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
