# airlock kernel session driver. Runs inside the session's sandbox, with the calls' code:
# nothing here is trusted by the host, which reads what it writes as job output.
#
# Protocol (all under D): the host writes call-N.py (the code) then call-N.go (a JSON
# order: wall time, context, its cwd and generation, contexts to forget, environment);
# the driver runs the code, its stdout and stderr going to out-N.stdout / out-N.stderr
# as they are written (the host streams them), the results' rich formats as files in
# files-N/ (released by the host like a job's /out), then writes res-N.json and
# res-N.done. While the cell runs, each display() output and plt.show() figure is also
# announced as it is made: its record (formats already written) appended as one JSON line
# to shown-N.jsonl, so the host can send it before the cell ends.
#
# Waiting for an order: the host writes a byte into the FIFO D/wake once call-N.go is in
# place. The driver waits on it with a short timeout and polls for the order file either
# way; only once a byte has come does it trust the FIFO and wait longer (where the FIFO is
# not the host's, as under gVisor, no byte ever comes and it keeps polling).
# Imported before the kernel says it is ready: only what its loop needs (and IPython,
# where the root has it: main()). What an ordinary call needs (json, linecache, _ast:
# `ast` took 7 ms of a 24 ms start, the built-in `_ast` gives the same trees) is imported
# right after, while the host's answer and the first order travel (_warm_up); base64 and
# traceback come with the first result or error that needs them.
import os
import select
import signal
import stat
import sys
import time
import types

D = "/work/.airlock"
VALUE_MAX = 8000
ERROR_VALUE_MAX = 2000
TRACEBACK_MAX = 16000
# How long to wait for an order between looks: before the wake-up FIFO has proved itself,
# and after.
POLL_S = 0.005
WOKEN_POLL_S = 0.5
# What a call's results may write into files-N/; the host's /out caps apply on top.
FIGURES_MAX = 16
RESULTS_MAX = 64
FORMAT_MAX_BYTES = 4 << 20

# Figures render off-screen, whatever the code asks for: there is no display. plt.show()
# is the driver's (below): it returns the open figures as results.
os.environ["MPLBACKEND"] = "Agg"

# Rich formats, as E2B names them: the MIME type, the result's key, the file extension,
# and whether the data is binary (base64 in a MIME bundle, bytes from a _repr_*_).
FORMATS = [
    ("text/html", "html", "html", False),
    ("text/markdown", "markdown", "md", False),
    ("image/svg+xml", "svg", "svg", False),
    ("image/png", "png", "png", True),
    ("image/jpeg", "jpeg", "jpeg", True),
    ("application/pdf", "pdf", "pdf", True),
    ("text/latex", "latex", "tex", False),
    ("application/json", "json", "json", False),
    ("application/javascript", "javascript", "js", False),
]
REPR_METHODS = {
    "text/html": "_repr_html_",
    "text/markdown": "_repr_markdown_",
    "image/svg+xml": "_repr_svg_",
    "image/png": "_repr_png_",
    "image/jpeg": "_repr_jpeg_",
    "application/pdf": "_repr_pdf_",
    "text/latex": "_repr_latex_",
    "application/json": "_repr_json_",
    "application/javascript": "_repr_javascript_",
}


class CallTimeout(BaseException):
    """Raised in the call when its wall time is up."""


def _alarm(signum, frame):
    raise CallTimeout("the call reached its wall time")


def _open(path):
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)


def _write(path, data):
    fd = _open(path)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


class Call:
    """What one call produces besides its output: results in order, their files."""

    def __init__(self, files, want_value_formats, shown):
        self.files = files
        self.want_value_formats = want_value_formats
        self.results = []
        self.written = 0
        self.shown_figures = set()
        # Where results made while the cell runs are announced (shown-N.jsonl); None once
        # the cell's code has returned (the main result and the figures left open come
        # with res-N.json only, so the announced ones are the first results, in order).
        self.shown = shown

    def announce(self, record):
        if self.shown is None:
            return
        fd = os.open(self.shown, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def add(self, bundle, main, prefix):
        """Adds a result from a MIME bundle ({mime: data}); the text in the record, every
        other format a file in files-N/."""
        if not main and len(self.results) >= RESULTS_MAX:
            if len(self.results) == RESULTS_MAX:
                print("more than %d results; the rest are dropped" % RESULTS_MAX, file=sys.stderr)
                self.results.append(None)
            return
        record = {"is_main_result": main, "formats": {}}
        text = bundle.get("text/plain")
        if isinstance(text, str):
            record["text"] = text[:VALUE_MAX]
        if not main or self.want_value_formats:
            index = len([r for r in self.results if r is not None]) + 1
            for mime, key, ext, binary in FORMATS:
                if mime not in bundle:
                    continue
                data = _format_bytes(bundle[mime], binary, mime)
                if data is None:
                    continue
                name = "%s-%d.%s" % (prefix, index, ext) if prefix != "value" else "value.%s" % ext
                if len(data) > FORMAT_MAX_BYTES:
                    print("the result's %s is %d bytes; not returned" % (key, len(data)), file=sys.stderr)
                    continue
                _write("%s/%s" % (self.files, name), data)
                record["formats"][key] = name
        if "text" in record or record["formats"]:
            self.results.append(record)
            if not main:
                self.announce(record)

    def figure(self, fig):
        """Adds an open matplotlib figure as a PNG result."""
        number = getattr(fig, "number", id(fig))
        if number in self.shown_figures:
            return
        if len(self.shown_figures) >= FIGURES_MAX:
            return
        self.shown_figures.add(number)
        index = len(self.shown_figures)
        name = "figure-%d.png" % index
        try:
            fig.savefig("%s/%s" % (self.files, name), format="png")
        except Exception as e:
            print("figure %s was not saved: %s" % (number, e), file=sys.stderr)
            return
        record = {
            "is_main_result": False,
            "text": "<Figure>",
            "formats": {"png": name},
        }
        self.results.append(record)
        self.announce(record)


def _format_bytes(data, binary, mime):
    try:
        if mime == "application/json":
            if isinstance(data, (bytes, str)):
                data = json.loads(data)
            return json.dumps(data).encode()
        if binary:
            if isinstance(data, str):
                import base64

                return base64.b64decode(data)
            return bytes(data)
        if isinstance(data, bytes):
            return data
        if isinstance(data, str):
            return data.encode("utf-8", "replace")
    except Exception as e:
        print("a %s result was not made: %s" % (mime, e), file=sys.stderr)
    return None


def _mime_bundle(value):
    """The formats of a value, as a notebook's display would give them (without IPython:
    its _repr_*_ methods, _repr_mimebundle_, and repr())."""
    shell = _ipython_shell()
    if shell is not None:
        try:
            data, _ = shell.display_formatter.format(value)
            return data
        except Exception as e:
            print("the value's formats were not made: %s" % e, file=sys.stderr)
    bundle = {}
    mimebundle = getattr(type(value), "_repr_mimebundle_", None)
    if mimebundle is not None:
        try:
            got = mimebundle(value, include=None, exclude=None)
            if isinstance(got, tuple):
                got = got[0]
            if isinstance(got, dict):
                bundle.update(got)
        except Exception as e:
            print("_repr_mimebundle_ failed: %s" % e, file=sys.stderr)
    for mime, method in REPR_METHODS.items():
        if mime in bundle:
            continue
        # Looked up on the type: an object whose __getattr__ answers anything is not
        # taken for one that has every format.
        fn = getattr(type(value), method, None)
        if fn is None:
            continue
        try:
            got = fn(value)
        except Exception as e:
            print("%s failed: %s" % (method, e), file=sys.stderr)
            continue
        if isinstance(got, tuple):
            got = got[0]
        if got is not None:
            bundle[mime] = got
    if "text/plain" not in bundle:
        try:
            bundle["text/plain"] = repr(value)
        except Exception as e:
            bundle["text/plain"] = "<repr failed: %s>" % e
    return bundle


def _is_figure(value):
    figure_module = sys.modules.get("matplotlib.figure")
    return figure_module is not None and isinstance(value, figure_module.Figure)


# The call in progress (display() and plt.show() add to it).
CURRENT = None


def display(*objs, **kwargs):
    """Shows each object as a result of the call, as a notebook's display() does."""
    raw = kwargs.get("raw", False)
    for obj in objs:
        if CURRENT is None:
            print(repr(obj))
            continue
        if raw and isinstance(obj, dict):
            CURRENT.add(obj, False, "display")
        elif _is_figure(obj):
            CURRENT.figure(obj)
        else:
            CURRENT.add(_mime_bundle(obj), False, "display")


def _show(*args, **kwargs):
    """plt.show(): every open figure becomes a result now, then is closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None or CURRENT is None:
        return
    for number in list(plt.get_fignums()):
        CURRENT.figure(plt.figure(number))
    plt.close("all")


class _PyplotHook:
    """Finds matplotlib.pyplot once, and makes its show() the driver's when it is loaded,
    whatever backend the code picks."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            module.show = _show

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _PyplotHook())

_SHELL = []


def _ipython_shell():
    """IPython's shell when the root has IPython (magics, !cmd, its display formatter),
    else None. Made once; its history is kept in memory only."""
    if _SHELL:
        return _SHELL[0]
    shell = None
    try:
        import importlib.util

        if importlib.util.find_spec("IPython") is None:
            raise ImportError("no IPython")
        # Its profile directory somewhere writable (HOME may not be).
        os.environ.setdefault("IPYTHONDIR", "/tmp/.ipython")
        from traitlets.config import Config
        from IPython.core.interactiveshell import InteractiveShell

        config = Config()
        config.HistoryManager.enabled = False
        shell = InteractiveShell.instance(config=config)
        shell.display_pub.publish = _publish
        # !cmd runs as a plain child with the kernel's descriptors (its output is the
        # call's, streamed), not through a pseudo-terminal the sandbox may not have.
        shell.system = shell.system_raw
        sys.displayhook = sys.__displayhook__
        sys.excepthook = sys.__excepthook__
    except Exception:
        shell = None
    _SHELL.append(shell)
    return shell


def _publish(data, metadata=None, *args, **kwargs):
    """IPython's display publisher: IPython.display.display() and HTML(...) land here."""
    if CURRENT is None:
        print(data.get("text/plain", ""))
        return
    CURRENT.add(data, False, "display")


class Context:
    """A code context: its own globals and working directory."""

    def __init__(self, generation):
        self.generation = generation
        self.module = types.ModuleType("__main__")
        self.globals = self.module.__dict__
        self.globals["__builtins__"] = __builtins__
        self.globals["display"] = display
        self.count = 0


CONTEXTS = {}


def _context(order):
    name = str(order.get("context") or "default")
    generation = int(order.get("generation") or 0)
    for gone in order.get("forget") or []:
        CONTEXTS.pop(str(gone), None)
    ctx = CONTEXTS.get(name)
    if ctx is None or ctx.generation != generation:
        ctx = Context(generation)
        CONTEXTS[name] = ctx
    return ctx


def _run(code, ctx, n):
    shell = _ipython_shell()
    if shell is not None:
        # Magics and !cmd become Python calls on the shell; its namespace is the context's.
        shell.user_module = ctx.module
        shell.user_ns = ctx.globals
        ctx.globals.setdefault("get_ipython", shell.get_ipython)
        code = shell.transform_cell(code)
    filename = "<cell %d>" % n
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ctx.globals)
    if last is not None:
        value = eval(compile(last, filename, "eval"), ctx.globals)
        # A trailing semicolon hides the value, as in a notebook.
        if code.rstrip().endswith(";"):
            return None
        return value
    return None


def _error_record(e):
    import traceback

    tb = e.__traceback__
    # The traceback from the cell's own frames on: the driver's are noise.
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    if tb is None:
        # Nothing ran in the cell (a SyntaxError): the error alone, not the driver's frames.
        text = "".join(traceback.format_exception_only(type(e), e))
    else:
        text = "".join(traceback.format_exception(type(e), e, tb))
    return {
        "name": type(e).__name__,
        "value": str(e)[:ERROR_VALUE_MAX],
        "traceback": text[-TRACEBACK_MAX:],
    }


def _save_open_figures(call):
    """The figures left open at the end of a call become results, then are closed."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        numbers = list(plt.get_fignums())
    except Exception:
        return
    for number in numbers:
        call.figure(plt.figure(number))
    if len(numbers) > FIGURES_MAX:
        print("%d figures were open; the first %d were saved" % (len(numbers), FIGURES_MAX),
              file=sys.stderr)
    try:
        plt.close("all")
    except Exception:
        pass


def _set_env(env):
    """Sets the call's environment; returns what restores the kernel's."""
    saved = {}
    for name, value in env.items():
        saved[name] = os.environ.get(name)
        os.environ[name] = value
    return saved


def _restore_env(saved):
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def run_call(n, order):
    global CURRENT
    timeout = float(order.get("timeout", 5))
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
    call = Call(files, bool(order.get("html", False)), "%s/shown-%d.jsonl" % (D, n))
    CURRENT = call
    res = {"status": "ok", "value": None, "error": None}
    ctx = _context(order)
    ctx.count += 1
    res["execution_count"] = ctx.count
    saved_env = _set_env(order.get("env") or {})
    try:
        signal.setitimer(signal.ITIMER_REAL, max(timeout, 0.001))
        try:
            cwd = order.get("cwd")
            if cwd:
                os.makedirs(cwd, exist_ok=True)
                os.chdir(cwd)
            value = _run(code, ctx, n)
            call.shown = None
            if value is not None and _is_figure(value):
                res["value"] = repr(value)[:VALUE_MAX]
                before = len(call.results)
                call.figure(value)
                if len(call.results) > before:
                    call.results[-1]["is_main_result"] = True
            elif value is not None:
                bundle = _mime_bundle(value)
                res["value"] = str(bundle.get("text/plain", ""))[:VALUE_MAX]
                call.add(bundle, True, "value")
                # A notebook's last values: _ is the latest.
                ctx.globals["_"] = value
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except CallTimeout:
        res["status"] = "timeout"
        print("the call reached its wall time and was interrupted", file=sys.stderr)
    except BaseException as e:
        res["status"] = "error"
        res["error"] = _error_record(e)
        sys.stderr.write(res["error"]["traceback"])
    finally:
        _restore_env(saved_env)
    call.shown = None
    # A call that failed still shows what it drew; one cut at its wall time does not
    # get more time to save.
    if res["status"] != "timeout":
        try:
            _save_open_figures(call)
        except BaseException as e:
            print("figures were not saved: %s" % e, file=sys.stderr)
    CURRENT = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    # The main result last, as E2B lists it after the displays.
    results = [r for r in call.results if r is not None]
    res["results"] = [r for r in results if not r["is_main_result"]] + [
        r for r in results if r["is_main_result"]
    ]
    _write("%s/res-%d.json" % (D, n), json.dumps(res).encode())
    os.close(_open("%s/res-%d.done" % (D, n)))


def main():
    signal.signal(signal.SIGALRM, _alarm)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    n = max(n, 1)
    os.makedirs(D, exist_ok=True)
    # The calls' code imports what sits in /work, whatever its context's cwd.
    if "/work" not in sys.path:
        sys.path.insert(0, "/work")
    import builtins

    builtins.display = display
    # Before `ready`: on a root with IPython its start can take seconds on a loaded host,
    # which the host's start timeout allows for, and a call's wall time must not pay.
    _ipython_shell()
    bell = _open_bell()
    trusted = False
    os.close(_open(D + "/ready"))
    _warm_up()
    while True:
        go = "%s/call-%d.go" % (D, n)
        try:
            with open(go) as f:
                order = json.load(f)
        except FileNotFoundError:
            # A call the host refused before ordering it leaves its number unused: the
            # next order may carry a later one.
            later = _next_order(n)
            if later != n:
                n = later
                continue
            if _wait(bell, WOKEN_POLL_S if trusted else POLL_S):
                trusted = True
            continue
        run_call(n, order)
        n += 1


def _warm_up():
    """What a call needs beyond the loop, once the kernel has said it is ready."""
    global _ast, json, linecache
    import _ast
    import json
    import linecache


def _open_bell():
    """The wake-up FIFO, opened read-write (so it never reads as ended), else None."""
    try:
        fd = os.open(D + "/wake", os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _wait(bell, timeout):
    """Waits for a wake-up or the timeout; True when a wake-up came."""
    if bell is None:
        time.sleep(timeout)
        return False
    try:
        ready, _, _ = select.select([bell], [], [], timeout)
        if not ready:
            return False
        return bool(os.read(bell, 4096))
    except (BlockingIOError, InterruptedError):
        return False


def _next_order(n):
    """The lowest call number at or after n with an order waiting, else n."""
    waiting = []
    for name in os.listdir(D):
        if name.startswith("call-") and name.endswith(".go"):
            try:
                waiting.append(int(name[5:-3]))
            except ValueError:
                pass
    later = [m for m in waiting if m >= n]
    return min(later) if later else n


main()
