"""Real PDF files for tests, written by hand (no PDF library involved in making them)."""

from __future__ import annotations

from collections.abc import Sequence


def pdf_bytes(pages: Sequence[str | None]) -> bytes:
    """A valid PDF: each page shows its text in Helvetica (lines split on "\\n"), or, for None,
    only a grey rectangle (a page with no text layer, like a scan)."""
    objects: list[bytes] = []
    page_ids = [3 + 2 * i for i in range(len(pages))]
    font_id = 3 + 2 * len(pages)
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = " ".join(f"{pid} 0 R" for pid in page_ids)
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    for pid, text in zip(page_ids, pages):
        if text is None:
            stream = b"0.5 g 72 72 300 300 re f"
        else:
            lines = [t.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for t in text.split("\n")]
            body = " T* ".join(f"({line}) Tj" for line in lines)
            stream = f"BT /F1 12 Tf 14 TL 72 720 Td {body} ET".encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 {font_id} 0 R >> >> /Contents {pid + 1} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")

    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
