# codecage's pre-started Python, for sandboxes built ahead of a request (the server's warm
# pool). It runs as `python3 -c THIS MODULE...` under the payload's every layer (rlimits,
# no capabilities, landlock, seccomp: the same spawn as a cold run's), imports the
# profile's preload modules, then waits for the request on fd 3: one JSON line with the
# argv, the environment and whether there is stdin. Then it runs the script as
# `python3 main.py` would: a fresh __main__ (nothing of this bootstrap is in it), sys.argv
# and sys.path[0] as for a script, exactly the request's environment, stdin at EOF when the
# request has none, tracebacks without this bootstrap's frames, and the interpreter's exit
# (threads, atexit, the script's objects finalized, stdio flushed, the exit status) without
# the teardown of the preloaded libraries. Its end it says to the init on fd 4 (the exit
# status, once the script's code has finished and stdio is flushed and closed), so that the
# run is answered without waiting for the kernel to free the interpreter's memory. The
# sandbox serves this one request and is destroyed after it.
import sys

# The init's pipe for the word on the end, as it was at the start: the script may close or
# reuse fd 4, and the word must not land in a file of its.
_CODECAGE_END = 4


def _codecage_boot():
    import gc
    import importlib
    import json
    import os

    global _codecage_end_pipe
    end = os.fstat(_CODECAGE_END)
    _codecage_end_pipe = (end.st_dev, end.st_ino)
    # Not for the script's subprocesses.
    os.set_inheritable(_CODECAGE_END, False)
    for name in sys.argv[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module the image lacks is simply not preloaded
            pass
    # What the preload made is permanent: the collections of the script's objects (and the
    # one at its end) do not walk it again.
    gc.collect()
    gc.freeze()
    os.write(3, b"ready\n")
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(3, 65536)
        if not chunk:
            # The sandbox was closed before a request came (the pool shrank or stopped).
            os._exit(0)
        buf += chunk
    os.close(3)
    request = json.loads(buf)
    if not request["stdin"]:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = request["argv"]
    path = os.path.abspath(argv[1])
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(path)
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    main = type(sys)("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__builtins__ = __builtins__
    from importlib.machinery import SourceFileLoader

    main.__loader__ = SourceFileLoader("__main__", path)
    sys.modules["__main__"] = main
    return code, main.__dict__


def _codecage_exit_code(e):
    # As the interpreter reads a SystemExit: None is 0, an int is itself, anything else
    # is printed and is 1.
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001
        pass
    return 1


def _codecage_main(code, main_globals):
    status, interrupted = 0, False
    try:
        exec(code, main_globals)
    except SystemExit as e:
        status = _codecage_exit_code(e)
    except BaseException as e:  # noqa: BLE001 - reported as the interpreter would
        # The bootstrap's frames go: the traceback starts at the script, as a cold run's.
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        try:
            sys.excepthook(type(e), e.with_traceback(tb), tb)
        except BaseException:  # noqa: BLE001
            pass
        status, interrupted = 1, isinstance(e, KeyboardInterrupt)
        del e, tb
    _codecage_finish(status, interrupted, main_globals)


def _codecage_finish(status, interrupted, main_globals):
    # What the interpreter's exit does for the script (wait for its threads, run atexit,
    # finalize what it holds: files are flushed and closed, __del__ runs, flush stdio)
    # without tearing down the preloaded libraries, which takes the preloaded numpy,
    # pandas and matplotlib some 0.3 s.
    import gc
    import os

    try:
        import threading

        threading._shutdown()
    except BaseException:  # noqa: BLE001
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    main_globals.clear()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            status = 120
    status = status & 0xFF if isinstance(status, int) else 1
    if interrupted:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    else:
        _codecage_say_end(status)
    os._exit(status)


def _codecage_say_end(status):
    # The script's code has finished and stdio is flushed: stdio closed (the run's output
    # is complete once every other process of the sandbox is gone), the status to the
    # init, which ends the run now; the exit itself, which frees the preloaded libraries'
    # memory, the sandbox's teardown waits for after the answer.
    import os

    for fd in (0, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        end = os.fstat(_CODECAGE_END)
        if (end.st_dev, end.st_ino) == _codecage_end_pipe:
            os.write(_CODECAGE_END, b"%d\n" % status)
    except OSError:
        pass


_codecage_code, _codecage_globals = _codecage_boot()
del _codecage_boot
_codecage_main(_codecage_code, _codecage_globals)
