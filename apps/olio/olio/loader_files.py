"""The loader's files: a fixed set of drawn pictures (with thumbnails) and small PDFs,
written into the file store under `loader/`, each named by the hash of its content.

The set is the same for every seed and scale (stock pictures, as Olio's loader copied the
same few images for every row): rows of users and events point to these shared files, and
writing them again is a no-op. Files are written to a temporary name and renamed, so a
server reading the store never sees half a file.
"""

import hashlib
import io
import os
import random
import shutil
from dataclasses import dataclass

from PIL import Image as PILImage
from PIL import ImageDraw

LOADER_DIR = "loader"  # under the file store; only the loader writes here
IMAGE_COUNT = 20
DOCUMENT_COUNT = 4
THUMBNAIL_BOX = (120, 120)


@dataclass(frozen=True)
class StoredImage:
    filename: str  # relative to the file store, e.g. "loader/3f2a...jpg"
    size: int
    width: int
    height: int
    thumbnail: str  # a JPEG at most THUMBNAIL_BOX


@dataclass(frozen=True)
class StoredDocument:
    filename: str
    size: int


def _jpeg(picture):
    out = io.BytesIO()
    # No EXIF, no timestamps: the same pixels always give the same bytes.
    picture.save(out, format="JPEG", quality=85, optimize=True)
    return out.getvalue()


def draw_picture(rng):
    """A picture of `rng`'s choosing: a two-colour gradient with a few shapes on it."""
    width, height = rng.choice(((640, 480), (800, 600), (480, 640), (600, 600), (720, 405)))
    top = tuple(rng.randrange(256) for _ in range(3))
    bottom = tuple(rng.randrange(256) for _ in range(3))
    gradient = PILImage.linear_gradient("L").resize((width, height))
    picture = PILImage.composite(PILImage.new("RGB", (width, height), bottom),
                                 PILImage.new("RGB", (width, height), top), gradient)
    draw = ImageDraw.Draw(picture)
    for _ in range(rng.randint(3, 8)):
        colour = tuple(rng.randrange(256) for _ in range(3))
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = x0 + rng.randint(20, width // 2), y0 + rng.randint(20, height // 2)
        shape = rng.choice(("ellipse", "rectangle", "triangle"))
        if shape == "ellipse":
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif shape == "rectangle":
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.polygon(((x0, y1), ((x0 + x1) // 2, y0), (x1, y1)), fill=colour)
    return picture


def make_pdf(title, lines):
    """A minimal valid PDF (one page, Helvetica text) with a correct cross-reference table."""
    def escape(s):
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    text = ["BT /F1 18 Tf 72 720 Td (" + escape(title) + ") Tj ET"]
    for i, line in enumerate(lines):
        text.append(f"BT /F1 11 Tf 72 {690 - 16 * i} Td (" + escape(line) + ") Tj ET")
    stream = "\n".join(text).encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _write(files_dir, data, suffix):
    """Write `data` as loader/<sha256 prefix><suffix> (if absent); its store-relative name."""
    name = f"{LOADER_DIR}/{hashlib.sha256(data).hexdigest()[:32]}{suffix}"
    path = os.path.join(files_dir, name)
    if not (os.path.exists(path) and os.path.getsize(path) == len(data)):
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # the web servers read it as another user
        os.replace(tmp, path)
    return name


def write_files(files_dir):
    """Make the pictures, thumbnails and documents in `files_dir`/loader; returns
    ([StoredImage], [StoredDocument], {every file name written})."""
    os.makedirs(os.path.join(files_dir, LOADER_DIR), mode=0o755, exist_ok=True)
    rng = random.Random("olio-loader:pictures")
    images, names = [], set()
    while len(images) < IMAGE_COUNT:
        picture = draw_picture(rng)
        data = _jpeg(picture)
        thumb = picture.copy()
        thumb.thumbnail(THUMBNAIL_BOX)
        thumb_data = _jpeg(thumb)
        name = _write(files_dir, data, ".jpg")
        if name in names:
            continue  # the same picture twice (never seen; kept distinct by construction)
        thumb_name = _write(files_dir, thumb_data, ".jpg")
        names.update((name, thumb_name))
        images.append(StoredImage(name, len(data), picture.width, picture.height, thumb_name))
    documents = []
    for i in range(1, DOCUMENT_COUNT + 1):
        data = make_pdf(f"Olio event document {i}", [
            f"Programme sheet number {i} for an Olio event.",
            "Doors open half an hour before the start.",
            "Bring a friend; the event is open to everyone.",
        ][: 1 + i % 3])
        name = _write(files_dir, data, ".pdf")
        names.add(name)
        documents.append(StoredDocument(name, len(data)))
    return images, documents, names


def remove_others(files_dir, keep):
    """Remove files under `files_dir`/loader that are not in `keep` (store-relative names):
    what an earlier loader version wrote. Returns how many were removed."""
    directory = os.path.join(files_dir, LOADER_DIR)
    removed = 0
    for entry in sorted(os.listdir(directory)) if os.path.isdir(directory) else ():
        if f"{LOADER_DIR}/{entry}" in keep:
            continue
        path = os.path.join(directory, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        removed += 1
    return removed
