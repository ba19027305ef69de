def _airlock_run(forked=False):
    import os, sys
    # A forked job's own modules are those it imports (taken before it arrives).
    before = frozenset(sys.modules) if forked else None
    # The built-in compile() creates the interpreter's AST types the first time it is
    # called (about 0.5 ms of Debian's python3.11): done here, before the job arrives (in a
    # zygote's child, already done by the zygote), rather than on the job's clock.
    compile("", "<airlock>", "exec", dont_inherit=True)
    def take(count):
        data = b""
        while len(data) < count:
            chunk = os.read({CONTROL_FD}, count - len(data))
            if not chunk:
                os._exit(0)
            data += chunk
        return data
    message = take(int(take(16), 16))
    if {CONTROL_FD} != 0:
        os.close({CONTROL_FD})
    if message[:1] in (b"r", b"w"):
        null = os.open(os.devnull, os.O_RDONLY if message[:1] == b"r" else os.O_RDWR)
        os.dup2(null, 0)
        os.close(null)
    if message[1:2] == b"o":
        # The host hands over the pipes it reads this job's output from itself (a warm
        # container's, not through its engine), and removes the socket before it does.
        had_socket = "_socket" in sys.modules
        import _socket
        handoff = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        handoff.connect("{OUTPUT_SOCKET}")
        _, ancillary, _, _ = handoff.recvmsg(1, _socket.CMSG_LEN(8))
        handoff.close()
        pipes = [int.from_bytes(data[i:i + 4], sys.byteorder)
                 for level, kind, data in ancillary for i in range(0, len(data) - 3, 4)]
        if len(pipes) != 2:
            os._exit(125)
        for fd, pipe in zip((1, 2), pipes):
            os.dup2(pipe, fd)
            os.close(pipe)
        if not had_socket:
            del sys.modules["_socket"]
        del had_socket, _socket, handoff, ancillary, pipes
    argv = [os.fsdecode(a) for a in message[2:].split(b"\0")]
    path = argv[0]
    # As for a script: unless the flags close it (-P, -I), the script's directory is
    # sys.path[0] where `-c` put the working directory.
    if not sys.flags.safe_path and sys.path and sys.path[0] == "":
        sys.path[0] = os.path.dirname(os.path.abspath(path))
    sys.argv = argv
    sys.orig_argv = sys.orig_argv[:-2] + argv
    import __main__
    SourceFileLoader = sys.modules["_frozen_importlib_external"].SourceFileLoader
    namespace = __main__.__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None,
                     __loader__=SourceFileLoader("__main__", path), __spec__=None,
                     __annotations__={}, __builtins__=builtins, __file__=path,
                     __cached__=None)
    del builtins, take, message, argv, __main__, SourceFileLoader
    interrupted = False
    try:
        try:
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec", dont_inherit=True)
        except SyntaxError as e:
            e.__traceback__ = None
            sys.excepthook(type(e), e, None)
            sys.exit(1)
        try:
            exec(code, namespace)
        except SystemExit:
            raise
        except BaseException as e:
            interrupted = isinstance(e, KeyboardInterrupt)
            e.__traceback__ = e.__traceback__.tb_next
            sys.excepthook(type(e), e, e.__traceback__)
            sys.exit(1)
    except SystemExit as e:
        if not forked:
            raise
        code = e.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            sys.stderr.write(str(code) + "\n")
            status = 1
        del e
    else:
        if not forked:
            return
        status = 0
    # A zygote's child ends as interpreter shutdown would for the job (its non-daemon
    # threads joined, atexit callbacks, standard streams flushed, its own objects released
    # and collected, so that its files are flushed and closed), without tearing down the
    # interpreter's and the preloaded modules' objects, which it shares with the zygote:
    # that would copy every page of them first (docs/speed.md).
    import atexit, gc
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException as e:
            sys.excepthook(type(e), e, e.__traceback__)
        del threading
    atexit._run_exitfuncs()
    def flush():
        flushed = True
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except BaseException:
                flushed = False
        return flushed
    flushed = flush()
    if gc.isenabled():
        gc.collect()
    namespace.clear()
    for name in [name for name in sys.modules if name not in before]:
        del sys.modules[name]
    del code, namespace
    gc.collect()
    flushed = flush() and flushed
    if interrupted:
        # As CPython ends on an unhandled KeyboardInterrupt: killed by SIGINT.
        import signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status if flushed else 120)
