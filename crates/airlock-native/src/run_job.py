def _airlock_run():
    import os, sys
    chunks = []
    while True:
        chunk = os.read(6, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(6)
    message = b"".join(chunks)
    if not message:
        os._exit(0)
    argv = [os.fsdecode(a) for a in message.split(b"\0")]
    path = argv[0]
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
    del builtins, chunks, chunk, message, argv, __main__, SourceFileLoader
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
        e.__traceback__ = e.__traceback__.tb_next
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)
