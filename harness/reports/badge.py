"""badge.svg: the certificate's verdict as a static shields-style badge a vendor can embed.

Static on purpose: no service to call, nothing fetched, the file is written beside the
certificate it states and says no more than it (verdict, engine, dtype, bundle). Colours mean
what they say: green only for "conformant" over the whole suite, amber for "conformant
(partial)" (checks deselected, or a concern not judged in full: the certificate's scope), red
for "nonconformant", grey for anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

LABEL = "EAGLE-3 conformance"
COLOURS = {"conformant": "#2e7d32", "nonconformant": "#c62828"}
PARTIAL = "#b26a00"  # conformant over less than the whole suite (certificate scope)
GREY = "#616161"
# Verdana 11px averages ~6.8 px a character (shields.io measures the same font); the text is
# also given a textLength so that a renderer with another font still fits the box
CHAR_PX = 6.8
PAD_PX = 10


def badge_text(cert: Mapping[str, Any]) -> str:
    engine = cert.get("engine") or {}
    run = cert.get("run") or {}
    bundle = cert.get("bundle") or {}
    verdict = str(cert.get("verdict") or "no verdict")
    if verdict == "conformant" and not (cert.get("scope") or {}).get("complete"):
        verdict += " (partial)"
    bits = [verdict, str(engine.get("name") or "?")]
    if run.get("dtype"):
        bits.append(str(run["dtype"]))
    if bundle.get("name"):
        bits.append(str(bundle["name"]) + ("" if bundle.get("pinned") else " (unpinned)"))
    return " · ".join(bits)


def _width(text: str) -> int:
    return int(len(text) * CHAR_PX + 2 * PAD_PX)


def render_badge(cert: Mapping[str, Any]) -> str:
    """The SVG text of the badge for `cert` (a certificate dict)."""
    value = badge_text(cert)
    colour = COLOURS.get(str(cert.get("verdict")), GREY)
    if cert.get("verdict") == "conformant" and not (cert.get("scope") or {}).get("complete"):
        colour = PARTIAL
    lw, vw = _width(LABEL), _width(value)
    total = lw + vw
    title = escape(f"{LABEL}: {value}")

    def text(x: float, s: str, w: int) -> str:
        length = int(w - 2 * PAD_PX)
        return (f'<text x="{x}" y="15" fill="#010101" fill-opacity=".3" textLength="{length}">'
                f'{escape(s)}</text><text x="{x}" y="14" textLength="{length}">{escape(s)}</text>')

    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total}" height="20" role="img" '
        f'aria-label="{title}"><title>{title}</title>'
        f'<linearGradient id="s" x2="0" y2="100%"><stop offset="0" stop-color="#bbb" '
        f'stop-opacity=".1"/><stop offset="1" stop-opacity=".1"/></linearGradient>'
        f'<clipPath id="r"><rect width="{total}" height="20" rx="3" fill="#fff"/></clipPath>'
        f'<g clip-path="url(#r)"><rect width="{lw}" height="20" fill="#555"/>'
        f'<rect x="{lw}" width="{vw}" height="20" fill="{colour}"/>'
        f'<rect width="{total}" height="20" fill="url(#s)"/></g>'
        f'<g fill="#fff" font-family="Verdana,Geneva,DejaVu Sans,sans-serif" font-size="11">'
        f'{text(PAD_PX, LABEL, lw)}{text(lw + PAD_PX, value, vw)}</g></svg>\n'
    )
