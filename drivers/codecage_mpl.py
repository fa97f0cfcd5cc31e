"""matplotlib backend of codecage's Python sessions: Agg, with show() handing every open
figure to the driver, which renders it as a PNG display of the current call."""

from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401


def show(*args, **kwargs):
    import sys

    driver = sys.modules.get("__codecage__")
    if driver is not None:
        driver.flush_figures()
