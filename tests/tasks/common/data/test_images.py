"""Every image mode Pillow opens reaches the network with its tones (rescale_tasks.common.data.images):
a real picture (three of scikit-learn's handwritten digits as the red, green and blue channels,
upscaled) written with Pillow in each mode and format, read by the classification and detection
loaders, must match its 8-bit reference within one quantization step. A bare ``convert("RGB")``
would clip 16-bit, 32-bit and float images at 255 (a handful of levels left) and drop alpha.
Photos with an EXIF orientation reach the transforms upright, as the same picture saved upright."""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import ExifTags, Image
from torchvision.transforms import v2

from rescale_tasks.classification.datasets import ImageFileDataset
from rescale_tasks.detection.coco import CocoDetection

SIZE = 32
QUANTUM = 1 / 255 + 1e-6  # one 8-bit step, as floats in [0, 1]


def reference() -> np.ndarray:
    """uint8 ``[H, W, 3]``: digits 3, 5 and 8 of scikit-learn's set as red, green and blue."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    channels = []
    for digit in (3, 5, 8):
        image = digits.images[np.flatnonzero(digits.target == digit)[0]] * (255 / 16)
        picture = Image.fromarray(image.round().astype(np.uint8)).resize((SIZE, SIZE), Image.BILINEAR)
        channels.append(np.asarray(picture))
    return np.stack(channels, axis=-1)


def alpha() -> np.ndarray:
    """An opacity ramp from transparent (left) to opaque (right), float in [0, 1]."""
    return np.tile(np.linspace(0, 1, SIZE), (SIZE, 1))


def over_white(rgb: np.ndarray, a: np.ndarray) -> np.ndarray:
    """What a viewer shows: ``rgb`` with opacity ``a`` over a white page."""
    a8 = np.rint(a * 255) / 255
    return a8[..., None] * rgb + (1 - a8[..., None]) * 255


def gray(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L"))


def png_rgb16(path: Path, rgb16: np.ndarray) -> None:
    """A 48-bit RGB PNG (Pillow cannot write one), chunk by chunk."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    height, width = rgb16.shape[:2]
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in rgb16)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def write(kind: str, folder: Path) -> tuple[Path, np.ndarray, str]:
    """The reference written as ``kind``; returns the file, what the network must see (float
    ``[H, W, 3]`` in 0..255) and the mode Pillow opens the file in."""
    rgb = reference()
    g = gray(rgb)
    a = alpha()
    path = folder / f"{kind}.{'tif' if kind.endswith('tiff') else 'pgm' if kind == 'pgm16' else 'png'}"
    if kind == "rgb":
        Image.fromarray(rgb).save(path)
        expected = rgb
    elif kind == "rgb48":
        png_rgb16(path, rgb.astype(np.uint16) * 257)
        expected = rgb
    elif kind == "l":
        Image.fromarray(g).save(path)
        expected = np.repeat(g[..., None], 3, -1)
    elif kind == "1":
        bits = Image.fromarray(g).convert("1")
        bits.save(path)
        expected = np.repeat(np.asarray(bits, dtype=np.uint8)[..., None] * 255, 3, -1)
    elif kind == "p":
        Image.fromarray(rgb).quantize(64).save(path)
        expected = np.asarray(Image.open(path).convert("RGB"))
    elif kind == "p_transparent":  # the background's palette entry marked transparent
        palette = Image.fromarray(rgb).quantize(64)
        index = int(np.bincount(np.asarray(palette).ravel()).argmax())
        palette.save(path, transparency=index)
        expected = np.asarray(palette.convert("RGB")).astype(np.float64)
        expected[np.asarray(palette) == index] = 255
    elif kind == "la":
        Image.fromarray(np.stack([g, np.rint(a * 255).astype(np.uint8)], -1), "LA").save(path)
        expected = over_white(np.repeat(g[..., None], 3, -1), a)
    elif kind == "rgba":
        Image.fromarray(np.concatenate([rgb, np.rint(a * 255).astype(np.uint8)[..., None]], -1), "RGBA").save(path)
        expected = over_white(rgb, a)
    elif kind == "cmyk_tiff":
        Image.fromarray(rgb).convert("CMYK").save(path)
        expected = rgb
    elif kind in ("i16_png", "i16_tiff"):
        Image.fromarray(g.astype(np.uint16) * 257).save(path)
        expected = np.repeat(g[..., None], 3, -1)
    elif kind == "i16_png_transparent":  # the background's grey value marked transparent (tRNS)
        g16 = g.astype(np.uint16) * 257
        key = int(np.bincount(g.ravel()).argmax()) * 257
        Image.fromarray(g16).save(path, transparency=key)
        expected = np.repeat(g[..., None], 3, -1).astype(np.float64)
        expected[g16 == key] = 255
    elif kind == "pgm16":  # maxval 65535
        path.write_bytes(f"P5 {SIZE} {SIZE} 65535\n".encode() + (g.astype(">u2") * 257).tobytes())
        expected = np.repeat(g[..., None], 3, -1)
    elif kind == "i32_tiff":
        Image.fromarray(np.rint(g * ((2 ** 31 - 1) / 255)).astype(np.int32)).save(path)
        expected = np.repeat(g[..., None], 3, -1)
    elif kind == "f_tiff":  # floats in [0, 1]
        Image.fromarray(g.astype(np.float32) / 255).save(path)
        expected = np.repeat(g[..., None], 3, -1)
    elif kind == "f255_tiff":  # floats in 0..255, Pillow's own float scale
        Image.fromarray(g).convert("F").save(path)
        expected = np.repeat(g[..., None], 3, -1)
    with Image.open(path) as opened:
        mode = opened.mode
    return path, np.asarray(expected, dtype=np.float64), mode


KINDS = {  # kind -> the mode Pillow opens it in
    "rgb": "RGB", "rgb48": "RGB", "l": "L", "1": "1", "p": "P", "p_transparent": "P", "la": "LA",
    "rgba": "RGBA", "cmyk_tiff": "CMYK", "i16_png": "I;16", "i16_png_transparent": "I;16", "i16_tiff": "I;16", "pgm16": "I",
    "i32_tiff": "I", "f_tiff": "F", "f255_tiff": "F",
}


@pytest.mark.parametrize("kind", KINDS)
def test_every_mode_reaches_the_classification_network_faithfully(tmp_path, kind):
    path, expected, mode = write(kind, tmp_path)
    assert mode == KINDS[kind]  # the file really is in the mode under test
    to_float = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()])
    image, _ = ImageFileDataset([(str(path), 0)], to_float)[0]
    want = torch.from_numpy(expected / 255).permute(2, 0, 1).float()
    assert image.shape == (3, SIZE, SIZE)
    assert (image - want).abs().max() <= QUANTUM, (kind, float((image - want).abs().max()))
    if kind != "1":  # the picture keeps its tones (a two-level image would pass above only for "1")
        assert len(torch.unique(image)) > 16


@pytest.mark.parametrize("kind", ["i16_png", "rgba", "f_tiff"])
def test_every_mode_reaches_the_detector_faithfully(tmp_path, kind):
    folder = tmp_path / "images"
    folder.mkdir()
    path, expected, _ = write(kind, folder)
    annotations = tmp_path / "instances.json"
    annotations.write_text(json.dumps({
        "images": [{"id": 1, "file_name": path.name, "width": SIZE, "height": SIZE}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 20, 20], "area": 400,
                         "iscrowd": 0}],
        "categories": [{"id": 1, "name": "digits"}]}))
    image = torch.as_tensor(CocoDetection(annotations, folder, masks=False).load_image(0))
    assert image.dtype == torch.uint8 and image.shape == (3, SIZE, SIZE)
    assert (image.double() - torch.from_numpy(expected).permute(2, 0, 1)).abs().max() <= 1


# ----------------------------------------------------------------------------- Pillow's decompression-bomb limits


def test_an_image_over_pillows_limits_is_said_as_such_once_per_file(tmp_path, monkeypatch, caplog):
    """Over PIL.Image.MAX_IMAGE_PIXELS (lowered here from its 89 million pixels) an image is read and
    said once per file through logging, not Pillow's warning; over twice that it is refused in a line
    naming the limit and the fix, not called undecodable. A data set of each task does the same."""
    import logging
    import warnings

    from rescale_tasks.common.data import CorruptImageError

    paths = [tmp_path / f"{n}.png" for n in range(2)]
    for path in paths:
        Image.new("RGB", (100, 100)).save(path)
    images = ImageFileDataset([(str(p), 0) for p in paths], v2.ToImage())
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 9_000)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error")  # no DecompressionBombWarning
        for index in (0, 1, 0, 1):
            assert images[index][0].shape == (3, 100, 100)
    said = [r.getMessage() for r in caplog.records if "decompression-bomb" in r.getMessage()]
    assert len(said) == 2 and str(paths[0]) in said[0] and str(paths[1]) in said[1], said
    assert "10,000 pixels, over Pillow's decompression-bomb warning limit of 9,000" in said[0]

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 4_000)
    with pytest.raises(CorruptImageError) as refused:
        images[0]
    line = str(refused.value)
    assert line.startswith(f"Image {paths[0]} is too large to decode (10,000 pixels, over the limit of 8,000"), line
    assert "Downscale" in line and "Cannot decode" not in line and "\n" not in line

    folder = tmp_path / "coco"
    folder.mkdir()
    Image.new("RGB", (100, 100)).save(folder / "a.png")
    annotations = tmp_path / "instances.json"
    annotations.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": 100, "height": 100}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 2, 20, 20], "area": 400,
                         "iscrowd": 0}],
        "categories": [{"id": 1, "name": "digits"}]}))
    with pytest.raises(CorruptImageError, match=r"a\.png is too large to decode .* Downscale"):
        CocoDetection(annotations, folder, masks=False).load_image(0)


# ----------------------------------------------------------------------------- EXIF orientation

#: EXIF orientation -> the pixels a camera stores for the upright picture ``u`` ``[H, W, C]`` (the tag
#: tells a viewer how to turn them back: 6 "turn clockwise", 8 "turn counterclockwise", 5 and 7 mirrored)
STORED = {
    2: lambda u: u[:, ::-1],
    3: lambda u: np.rot90(u, 2),
    4: lambda u: u[::-1],
    5: lambda u: u.transpose(1, 0, 2),
    6: lambda u: np.rot90(u, 1),
    7: lambda u: u[::-1, ::-1].transpose(1, 0, 2),
    8: lambda u: np.rot90(u, -1),
}
TO_FLOAT = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ToPureTensor()])


def portrait() -> np.ndarray:
    """uint8 ``[48, 32, 3]``: the reference with its top half again below, taller than wide."""
    rgb = reference()
    return np.ascontiguousarray(np.concatenate([rgb, rgb[:SIZE // 2]], axis=0))


def tagged(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = orientation
    return exif


def load(path: Path) -> torch.Tensor:
    """``path`` as the classification data path gives it to the transforms, as floats."""
    return ImageFileDataset([(str(path), 0)], TO_FLOAT)[0][0]


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_exif_orientation_is_applied_before_the_transforms(tmp_path, orientation):
    upright = portrait()
    path = tmp_path / "photo.png"  # lossless: the turned pixels must be the picture exactly
    Image.fromarray(np.ascontiguousarray(STORED[orientation](upright))).save(path, exif=tagged(orientation))
    image = load(path)
    assert image.shape == (3, 48, 32)
    assert torch.equal(image, TO_FLOAT(Image.fromarray(upright)))


@pytest.mark.parametrize("orientation", [6, 8])
def test_a_camera_jpeg_loads_as_the_same_picture_saved_upright(tmp_path, orientation):
    upright = portrait()
    camera, saved = tmp_path / "camera.jpg", tmp_path / "upright.jpg"
    Image.fromarray(np.ascontiguousarray(STORED[orientation](upright))).save(
        camera, quality=95, subsampling=0, exif=tagged(orientation))
    Image.fromarray(upright).save(saved, quality=95, subsampling=0)
    with Image.open(camera) as stored:
        assert stored.size == (48, 32)  # the file holds the pixels sideways
    image, reference_image = load(camera), load(saved)
    assert image.shape == reference_image.shape == (3, 48, 32)
    assert (image - reference_image).abs().mean() < 2 / 255  # the same picture, up to JPEG's rounding
