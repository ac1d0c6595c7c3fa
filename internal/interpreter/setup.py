# Run silently in every Python kernel of the code interpreter before the
# first execution. It must not import pandas or matplotlib (seconds of start
# time): the formatters are registered by type name and only run for
# objects of those libraries.
def _corral_setup():
    import json
    import os
    import sys
    import types

    from IPython import get_ipython
    from IPython.core.formatters import JSONFormatter
    from traitlets import Unicode

    ip = get_ipython()
    ip.run_line_magic("colors", "nocolor")

    mod = types.ModuleType("_corral")
    saved = []

    def env_push(pairs):
        env = json.loads(pairs)
        saved.append({k: os.environ.get(k) for k in env})
        os.environ.update(env)

    def env_pop():
        if not saved:
            return
        for k, v in saved.pop().items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    mod.env_push, mod.env_pop = env_push, env_pop
    sys.modules["_corral"] = mod

    def jsonable(values):
        return json.loads(values.to_json(orient="values", date_format="iso"))

    def frame_data(df):
        return {str(c): jsonable(df[c]) for c in df.columns}

    def series_data(s):
        return {str(s.name if s.name is not None else "values"): jsonable(s)}

    def num(v):
        try:
            f = float(v)
        except (TypeError, ValueError):
            return str(v)
        return int(f) if f.is_integer() else f

    def axes_chart(ax):
        from matplotlib.collections import PathCollection
        from matplotlib.lines import Line2D
        from matplotlib.patches import Rectangle, Wedge

        chart = {
            "title": ax.get_title() or None,
            "x_label": ax.get_xlabel() or None,
            "y_label": ax.get_ylabel() or None,
        }
        wedges = [p for p in ax.patches if isinstance(p, Wedge)]
        bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() != 0]
        scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
        lines = [ln for ln in ax.get_lines() if isinstance(ln, Line2D)]

        def axis(name, ticks, labels, scale):
            chart[name + "_ticks"] = [num(t) for t in ticks]
            chart[name + "_tick_labels"] = [l.get_text() for l in labels]
            chart[name + "_scale"] = scale

        def label(artist):
            text = str(artist.get_label())
            return "" if text.startswith("_") else text

        if wedges:
            labels = [t.get_text() for t in ax.texts]
            chart["type"] = "pie"
            chart["elements"] = [
                {
                    "label": labels[i] if i < len(labels) else str(i),
                    "angle": num(w.theta2 - w.theta1),
                    "radius": num(w.r),
                }
                for i, w in enumerate(wedges)
            ]
        elif bars:
            ticks = {round(t, 6): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
            chart["type"] = "bar"
            chart["elements"] = []
            for c in ax.containers:
                group = label(c)
                for p in c:
                    x = p.get_x() + p.get_width() / 2
                    chart["elements"].append(
                        {"label": ticks.get(round(x, 6), num(x)), "group": group, "value": num(p.get_height())}
                    )
        elif scatters:
            chart["type"] = "scatter"
            chart["elements"] = [
                {"label": label(c), "points": [[num(x), num(y)] for x, y in c.get_offsets()]}
                for c in scatters
            ]
        elif lines:
            chart["type"] = "line"
            chart["elements"] = [
                {"label": label(ln), "points": [[num(x), num(y)] for x, y in zip(ln.get_xdata(), ln.get_ydata())]}
                for ln in lines
            ]
        else:
            chart["type"] = "unknown"
            chart["elements"] = []
        if chart["type"] in ("line", "scatter"):
            axis("x", ax.get_xticks(), ax.get_xticklabels(), ax.get_xscale())
            axis("y", ax.get_yticks(), ax.get_yticklabels(), ax.get_yscale())
        return chart

    def compact(v):
        # E2B's streams leave out fields whose value is None.
        if isinstance(v, dict):
            return {k: compact(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [compact(x) for x in v]
        return v

    def figure_chart(fig):
        axes = fig.get_axes()
        if not axes:
            return None
        if len(axes) == 1:
            return compact(axes_chart(axes[0]))
        title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else None
        return compact({"type": "superchart", "title": title, "elements": [axes_chart(a) for a in axes]})

    class ByTypeName(JSONFormatter):
        # Formatters look types up by name, and in their own __call__:
        # matplotlib's inline backend drops every formatter's printer for
        # Figure when it is configured, which happens at the first import
        # of pyplot, after this code ran.
        printers = {}

        def __call__(self, obj):
            t = type(obj)
            fn = self.printers.get((t.__module__, t.__name__))
            if fn is None:
                return None
            try:
                return fn(obj)
            except Exception:
                # A figure or frame the extractor cannot read still shows
                # as an image or table; the structured form is left out.
                return None

    class DataFormatter(ByTypeName):
        format_type = Unicode("application/vnd.corral.data+json")
        printers = {
            ("pandas.core.frame", "DataFrame"): frame_data,
            ("pandas.core.series", "Series"): series_data,
        }

    class ChartFormatter(ByTypeName):
        format_type = Unicode("application/vnd.corral.chart+json")
        printers = {("matplotlib.figure", "Figure"): figure_chart}

    formatters = ip.display_formatter.formatters
    for cls in (DataFormatter, ChartFormatter):
        f = cls(parent=ip.display_formatter)
        formatters[f.format_type] = f


_corral_setup()
del _corral_setup
