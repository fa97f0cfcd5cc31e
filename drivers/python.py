"""The Python REPL driver of a codecage session.

One persistent namespace. It reads requests from the session's channel (fd 3 at start,
moved to a high fd at once; one JSON object per line), runs each cell, and answers on the
channel: "display" events, then "done" with the execution count, the trailing
expression's MIME bundle, and the exception if any. The cell's own output goes to fd 1
and 2, which the launcher reads as streams. Everything this driver sends is treated as
untrusted by the launcher: the cell could write to the channel too.

The driver owns the streams of a call: before each call fds 0, 1 and 2 are the session's
again and sys.stdin, sys.stdout and sys.stderr the driver's own objects, whatever the
cell before did to them (closed, replaced, redirected). Should a cell close the driver's
own copies too, "done" asks the launcher to start the interpreter again ("restart").
"""

# What every call needs, and no more: a new session's start is its interpreter's start and
# these imports, so what only some calls need (ast.py for cells of statements, traceback
# for exceptions, base64 for images, threading for stdin) is imported by the call that
# needs it. signal's enums and ast.py's helpers were a quarter of the imports' time; their
# C modules (_signal, _ast) do what the driver needs of them.
import _ast
import _signal
import _thread
import fcntl
import io
import json
import linecache
import os
import sys

MAX_TEXT = 64 * 1024        # characters of one text MIME type
# pixels: every image shown (figures, PNG displays) is at most this large, scaled here in
# the sandbox; the server never decodes an image (it checks the PNG header only)
MAX_IMAGE_EDGE = int(os.environ.get("CODECAGE_IMAGE_MAX_EDGE", "1024"))
MAX_DPI = 100
MAX_DECODE_PIXELS = 50_000_000  # larger images are not decoded to be shown at all
DRIVER_FILE = __file__


def high_copy(fd, below):
    """A close-on-exec copy of `fd` at the highest free number under `below`: out of the
    way of the low fds a cell opens, closes and redirects."""
    for target in range(below - 1, 9, -1):
        try:
            os.fstat(target)
        except OSError:
            return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, target)
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def fd_limit():
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1024 if soft == resource.RLIM_INFINITY else min(soft, 1 << 16)


TOP = fd_limit()
CHANNEL_IN = high_copy(3, TOP)
CHANNEL_OUT = high_copy(3, TOP)
os.close(3)
# The session's stdin (/dev/null), stdout and stderr pipes, as the launcher gave them.
SAVED = {fd: high_copy(fd, TOP) for fd in (0, 1, 2)}
channel_in = os.fdopen(CHANNEL_IN, "rb")
channel_out = os.fdopen(CHANNEL_OUT, "wb", buffering=0)

namespace = {"__name__": "__main__", "__builtins__": __builtins__}
loop = None
MAIN_THREAD = _thread.get_ident()


def event_loop():
    """The session's one event loop (top-level await runs on it, tasks live across cells),
    made and set for the main thread on first use."""
    global loop
    if loop is None:
        import asyncio

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    return loop


class LoopOnImport:
    """asyncio, with the ssl module it imports, was a fifth of a new session's start-up, so
    it is imported when first used: by a cell (or a library a cell imports), or by a
    top-level await. Its first import in the main thread makes and sets the session's loop
    as soon as the module is there, so `asyncio.get_event_loop()` finds that loop in every
    cell, as when the driver made it at start. Any other import is not this finder's."""

    def find_spec(self, name, path=None, target=None):
        if name != "asyncio" or _thread.get_ident() != MAIN_THREAD:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            exec_module = spec.loader.exec_module

            def exec_then_make_loop(module):
                exec_module(module)
                event_loop()

            spec.loader.exec_module = exec_then_make_loop
        return spec


sys.meta_path.insert(0, LoopOnImport())
execution_count = 0
current_id = None
in_cell = False


def send(event):
    channel_out.write((json.dumps(event, separators=(",", ":")) + "\n").encode())


def clip(text):
    if len(text) > MAX_TEXT:
        return text[:MAX_TEXT] + f"\n... ({len(text) - MAX_TEXT} more characters)"
    return text


def mime_bundle(value):
    """What the REPL shows for a value: text/plain always, rich types when it has them."""
    bundle = {}
    module = type(value).__module__ or ""
    if module.startswith("pandas") and hasattr(value, "shape"):
        import pandas

        with pandas.option_context(
            "display.max_rows", 20, "display.min_rows", 10, "display.max_columns", 20,
            "display.max_colwidth", 50, "display.width", 120,
        ):
            bundle["text/plain"] = clip(repr(value))
            if hasattr(value, "_repr_html_"):
                html = value._repr_html_()
                if html:
                    bundle["text/html"] = clip(html)
        dtypes = getattr(value, "dtypes", None)
        if dtypes is not None and hasattr(dtypes, "items"):
            described = ", ".join(f"{k}: {v}" for k, v in list(dtypes.items())[:50])
            bundle["text/plain"] += f"\n\nshape {tuple(value.shape)}; dtypes {described}"
        return bundle
    if hasattr(value, "_repr_mimebundle_"):
        try:
            data = value._repr_mimebundle_()
            if isinstance(data, tuple):
                data = data[0]
            for mime, content in (data or {}).items():
                add(bundle, mime, content)
        except Exception:
            pass
    for method, mime in (
        ("_repr_png_", "image/png"),
        ("_repr_jpeg_", "image/jpeg"),
        ("_repr_svg_", "image/svg+xml"),
        ("_repr_html_", "text/html"),
        ("_repr_markdown_", "text/markdown"),
        ("_repr_latex_", "text/latex"),
        ("_repr_json_", "application/json"),
    ):
        if mime not in bundle and hasattr(value, method):
            try:
                add(bundle, mime, getattr(value, method)())
            except Exception:
                pass
    bundle["text/plain"] = clip(repr(value))
    return bundle


def add(bundle, mime, content):
    if content is None:
        return
    import base64

    if mime == "image/png":
        try:
            data = content if isinstance(content, bytes) else base64.b64decode(content)
        except Exception:
            return
        content = bounded_png(data)
        if content is None:
            return
    if isinstance(content, bytes):
        bundle[mime] = base64.b64encode(content).decode()
    elif isinstance(content, str):
        bundle[mime] = content if mime.startswith("image/") else clip(content)
    else:
        bundle[mime] = clip(json.dumps(content, default=str))


def bounded_png(data):
    """The PNG as it is if its longer edge is within MAX_IMAGE_EDGE, else decoded and
    scaled down to it here (Pillow, within the sandbox's limits); None if it is not one."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if max(width, height) <= MAX_IMAGE_EDGE:
        return data
    if width * height > MAX_DECODE_PIXELS:
        print(f"codecage: a {width}x{height} image is too large to show; scale it down first",
              file=sys.stderr)
        return None
    try:
        from PIL import Image

        picture = Image.open(io.BytesIO(data))
        picture.thumbnail((MAX_IMAGE_EDGE, MAX_IMAGE_EDGE))
        out = io.BytesIO()
        picture.save(out, format="PNG")
        return out.getvalue()
    except Exception as error:
        print(f"codecage: an image could not be scaled down to show: {error}", file=sys.stderr)
        return None


def display(*values):
    """Shows each value as a display of the current call (as IPython's display)."""
    for value in values:
        send({"ev": "display", "id": current_id, "data": mime_bundle(value)})


def flush_figures():
    """Every open matplotlib figure as a PNG display, then closed (IPython's inline backend
    does the same). Rendered here, inside the sandbox, at a bounded size."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    import base64

    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        width, height = figure.get_size_inches()
        dpi = min(MAX_DPI, MAX_IMAGE_EDGE / max(width, height, 0.01))
        buffer = io.BytesIO()
        try:
            figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
        except Exception as error:
            print(f"codecage: figure {number} could not be rendered: {error}", file=sys.stderr)
            continue
        send({
            "ev": "display",
            "id": current_id,
            "data": {
                "image/png": base64.b64encode(buffer.getvalue()).decode(),
                "text/plain": f"<Figure {number}>",
            },
        })
    pyplot.close("all")


def on_sigint(signum, frame):
    # Only the cell is interrupted; the driver's own code finishes what it is doing.
    if in_cell:
        raise KeyboardInterrupt


def exception_info(error):
    """name, value and the traceback of the user's frames only."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == DRIVER_FILE:
        tb = tb.tb_next
    lines = traceback.format_exception(type(error), error, tb)
    return {"name": type(error).__name__, "value": str(error), "traceback": lines}


def evaluate(code_object):
    result = eval(code_object, namespace)
    if code_object.co_flags & 0x80:  # CO_COROUTINE: top-level await
        result = event_loop().run_until_complete(result)
    return result


def run_cell(code):
    global execution_count, in_cell
    execution_count += 1
    filename = f"<cell {execution_count}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    flags = _ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    result = None
    exception = None
    in_cell = True
    try:
        # ast.parse, without ast.py.
        tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST)
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        evaluate(compile(tree, filename, "exec", flags=flags))
        if last is not None:
            value = evaluate(compile(last, filename, "eval", flags=flags))
            if value is not None:
                namespace["_"] = value
                result = mime_bundle(value)
    except BaseException as error:  # the cell's SystemExit and KeyboardInterrupt too
        exception = exception_info(error)
    finally:
        in_cell = False
    return result, exception


def text_stream(fd, mode):
    """A text stream over fd as `python3 -u` makes sys.stdout: unbuffered, written through."""
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="strict")
    return io.TextIOWrapper(
        raw, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
        write_through=True,
    )


STREAMS = {}


def own_streams():
    """fds 0, 1, 2 and sys.stdin/stdout/stderr as the session made them, whatever a cell
    did to them. False when the driver's own copies are gone (the cell closed them):
    only a new interpreter gets the session's pipes back then."""
    for fd, saved in SAVED.items():
        try:
            theirs = os.fstat(saved)
        except OSError:
            return False
        try:
            same = os.path.samestat(os.fstat(fd), theirs)
        except OSError:
            same = False
        if not same:
            os.dup2(saved, fd)
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        stream = STREAMS.get(fd)
        if stream is None or stream.closed:
            stream = STREAMS[fd] = text_stream(fd, mode)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    return True


def with_stdin(text, body):
    """Runs `body` with `text` on fd 0 and sys.stdin (input(), subprocesses)."""
    if text is None:
        return body()
    import threading

    read_end, write_end = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write_end, text.encode()), os.close(write_end)))
    writer.start()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    os.close(read_end)
    saved_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    try:
        return body()
    finally:
        sys.stdin = saved_stdin
        os.dup2(saved, 0)
        os.close(saved)
        writer.join(timeout=1)


def main():
    global current_id
    sys.path.insert(0, os.path.dirname(DRIVER_FILE))
    os.environ.setdefault("MPLBACKEND", "module://codecage_mpl")
    if os.environ.get("MPLBACKEND") == "Agg":
        os.environ["MPLBACKEND"] = "module://codecage_mpl"
    namespace["display"] = display
    sys.modules["__codecage__"] = sys.modules[__name__]
    own_streams()
    send({"ev": "ready"})
    for line in channel_in:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") != "execute":
            continue
        current_id = request.get("id")
        _signal.signal(_signal.SIGINT, on_sigint)
        restart = not own_streams()
        result, exception = None, None
        if not restart:
            result, exception = with_stdin(
                request.get("stdin"), lambda: run_cell(request.get("code", ""))
            )
            # Figures and the flush below go to the session's streams, not the cell's.
            restart = not own_streams()
        try:
            flush_figures()
        except BaseException as error:
            print(f"codecage: figures could not be shown: {error}", file=sys.stderr)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        send({
            "ev": "done",
            "id": current_id,
            "execution_count": execution_count,
            "result": result,
            "exception": exception,
            "restart": restart,
        })


if __name__ == "__main__":
    _signal.signal(_signal.SIGINT, on_sigint)
    main()
