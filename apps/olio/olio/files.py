"""The file store: uploaded images (with thumbnails) and documents, kept under one directory.

An upload is saved under a name the store makes (``uploads/<2 hex>/<32 hex>.<ext>``), never
the client's file name, so no upload can name a path outside the store; its type comes from
its content, never from the client: an image must open and decode with Pillow as JPEG, PNG
or GIF within MAX_PIXELS, a document must start with ``%PDF-``. Both have size limits.
Files are written to a temporary name and renamed, so a reader never sees half a file.

Names stored in the database (`Image.filename`, `Image.thumbnail`, `Document.filename`) are
paths relative to the store's root with ``/`` separators (the loader's too), served at
``<files_url>/<name>``; `resolve` turns one back into a path and refuses any that would
leave the store.
"""

import io
import os
import secrets
import tempfile
import warnings
from pathlib import Path

from PIL import Image as PILImage
from PIL import ImageOps, UnidentifiedImageError

from .models import Document, Image

MAX_IMAGE_BYTES = 4 << 20
MAX_DOCUMENT_BYTES = 8 << 20
MAX_PIXELS = 25_000_000  # beyond this an image is refused (a "decompression bomb")
THUMBNAIL_SIZE = (120, 120)
IMAGE_TYPES = {"JPEG": ("jpg", "image/jpeg"), "PNG": ("png", "image/png"), "GIF": ("gif", "image/gif")}


class BadUpload(ValueError):
    """An upload is too large or not what it claims to be (the message says which)."""


class FileStore:
    def __init__(self, root):
        self.root = Path(root).resolve()

    def ensure(self):
        self.root.mkdir(parents=True, exist_ok=True)

    def resolve(self, name):
        """The path of stored file `name`; BadUpload if it would be outside the store."""
        path = (self.root / name).resolve()
        if not path.is_relative_to(self.root) or path == self.root:
            raise BadUpload(f"{name!r} is not a file of the store")
        return path

    def _new_name(self, ext, suffix=""):
        token = secrets.token_hex(16)
        return f"uploads/{token[:2]}/{token}{suffix}.{ext}"

    def _write(self, name, data):
        path = self.resolve(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self, *names):
        """Remove stored files (after a change that referenced them was not saved)."""
        for name in names:
            if name:
                self.resolve(name).unlink(missing_ok=True)

    def save_image(self, upload):
        """Store an inspected image (`inspect_image`) and its thumbnail; the Image row."""
        data, picture, kind = upload
        width, height = picture.size
        ext, content_type = IMAGE_TYPES[kind]
        name = self._new_name(ext)
        thumb_name = name.rsplit(".", 1)[0] + "_thumb.jpg"
        self._write(name, data)
        try:
            self._write(thumb_name, make_thumbnail(picture))
        except BaseException:
            self.delete(name)
            raise
        return Image(filename=name, content_type=content_type, size=len(data),
                     width=width, height=height, thumbnail=thumb_name)

    def save_document(self, data):
        """Store an inspected PDF (`inspect_document`); the Document row."""
        name = self._new_name("pdf")
        self._write(name, data)
        return Document(filename=name, content_type="application/pdf", size=len(data))


def inspect_document(data):
    """`data`, if it is a PDF within MAX_DOCUMENT_BYTES; else BadUpload."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise BadUpload(f"the document is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    if not data.startswith(b"%PDF-"):
        raise BadUpload("the document is not a PDF file")
    return data


def inspect_image(data):
    """(data, decoded Pillow image, format name) of `data`; BadUpload unless it is a whole
    JPEG, PNG or GIF of at most MAX_PIXELS pixels and MAX_IMAGE_BYTES bytes."""
    if len(data) > MAX_IMAGE_BYTES:
        raise BadUpload(f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            picture = PILImage.open(io.BytesIO(data), formats=list(IMAGE_TYPES))
            if picture.width * picture.height > MAX_PIXELS:
                raise BadUpload(f"the image has more than {MAX_PIXELS:,} pixels")
            kind = picture.format
            picture.load()  # decodes every pixel: a truncated or corrupt file fails here
    except BadUpload:
        raise
    except (UnidentifiedImageError, PILImage.DecompressionBombWarning, PILImage.DecompressionBombError):
        raise BadUpload("the file is not a JPEG, PNG or GIF image") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise BadUpload(f"the image cannot be read: {e}") from None
    return data, picture, kind


def make_thumbnail(picture):
    """JPEG bytes of `picture` shrunk to fit THUMBNAIL_SIZE, upright, on white."""
    thumb = ImageOps.exif_transpose(picture)
    thumb.thumbnail(THUMBNAIL_SIZE)
    if thumb.mode in ("RGBA", "LA", "P"):
        thumb = thumb.convert("RGBA")
        canvas = PILImage.new("RGB", thumb.size, "white")
        canvas.paste(thumb, mask=thumb.getchannel("A"))
        thumb = canvas
    elif thumb.mode != "RGB":
        thumb = thumb.convert("RGB")
    out = io.BytesIO()
    thumb.save(out, "JPEG", quality=85)
    return out.getvalue()
