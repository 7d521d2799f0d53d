"""Real COCO-format data for the detection tests, with known answers.

- ``coco_canvases``: the scikit-learn handwritten digits (8x8, scaled x3 to 24x24) pasted at known
  places on black 64x48 and 48x64 canvases, written in the standard layout
  ``annotations/instances_{train,val}2017.json`` + ``{train,val}2017/``. Categories have
  non-contiguous ids (3, 7, 11 = digits 0, 1, 2); most objects are polygons of the pasted square
  (box = that square), some are RLE masks of the digit's ink (box = the ink's bounding box). The
  train split also holds a crowd region (uncompressed RLE), an image without annotations and one
  degenerate box (0.5 px wide after clipping). ``truth`` lists every object with its mask.
- ``quokka_coco``: the annotated photo shipped in the ``imgaug`` 0.4.0 wheel (which ``make test``
  downloads from the package registry into ``.venv/test-data/`` before the tests run: they never
  touch the network; read from the zip without importing imgaug), as a one-image COCO set with its
  box and 39-point polygon.
"""
from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

# where `make test` puts the test data that registry packages ship: inside the environment running the tests
TEST_DATA = Path(sys.prefix) / "test-data"
IMGAUG_WHEEL = "imgaug-0.4.0-py2.py3-none-any.whl"

SCALE = 3  # 8x8 digits -> 24x24 patches
PATCH = 8 * SCALE
CATEGORIES = [{"id": 3, "name": "zero", "supercategory": "digit"},
              {"id": 7, "name": "one", "supercategory": "digit"},
              {"id": 11, "name": "two", "supercategory": "digit"}]
CATEGORY_OF_DIGIT = {0: 3, 1: 7, 2: 11}
LANDSCAPE, PORTRAIT = (64, 48), (48, 64)  # (width, height)
# two non-overlapping patch corners per orientation
SLOTS = {LANDSCAPE: [(4, 4), (36, 20)], PORTRAIT: [(4, 4), (20, 36)]}


class CocoCanvases(NamedTuple):
    root: Path  # the standard layout lives here
    truth: dict[str, Any]  # per split: list of images (see write_coco_canvases)


def _digits() -> dict[int, list[np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return {d: [digits.images[i] for i in np.flatnonzero(digits.target == d)[:6]] for d in CATEGORY_OF_DIGIT}


def _rle_uncompressed(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE (column-major run lengths, starting with a run of zeros)."""
    flat = mask.flatten(order="F").astype(np.uint8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0] == 1:
        counts = [0] + counts
    return {"size": list(mask.shape), "counts": counts}


def _rle_compressed(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": list(rle["size"]), "counts": rle["counts"].decode("ascii")}


def _image_plan(split: str) -> list[dict]:
    """What each image holds: per object (digit, slot, kind) with kind polygon / rle / crowd."""
    if split == "train":
        return [
            {"size": LANDSCAPE, "objects": [(0, 0, "polygon"), (1, 1, "rle")]},
            {"size": PORTRAIT, "objects": [(2, 0, "polygon"), (0, 1, "polygon")]},
            {"size": LANDSCAPE, "objects": [(1, 0, "polygon"), (2, 1, "crowd")]},
            {"size": PORTRAIT, "objects": [(1, 0, "polygon")], "degenerate": True},
            {"size": LANDSCAPE, "objects": []},  # no annotations
            {"size": PORTRAIT, "objects": [(0, 0, "polygon"), (2, 1, "rle")]},
            {"size": LANDSCAPE, "objects": [(2, 0, "polygon"), (0, 1, "polygon")]},
            {"size": PORTRAIT, "objects": [(1, 0, "rle"), (1, 1, "polygon")]},
            {"size": LANDSCAPE, "objects": [(0, 1, "polygon")]},
        ]
    return [
        {"size": LANDSCAPE, "objects": [(0, 0, "polygon"), (2, 1, "polygon")]},
        {"size": PORTRAIT, "objects": [(1, 0, "polygon"), (0, 1, "rle")]},
        {"size": LANDSCAPE, "objects": [(1, 1, "polygon")], "ext": ".jpg"},
        {"size": PORTRAIT, "objects": [(2, 0, "polygon"), (1, 1, "polygon")]},
    ]


def write_coco_canvases(root: Path, splits: tuple[str, ...] = ("train", "val")) -> dict[str, Any]:
    """Write the digit canvases under ``root`` in the standard COCO layout; returns the truth:
    ``{split: [{"id", "file_name", "width", "height", "objects": [{"ann_id", "category_id",
    "box" (xyxy), "mask" (bool [H, W]), "iscrowd", "kind"}], "degenerate_ann_ids": [...]}]}``."""
    root = Path(root)
    digits = _digits()
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    truth: dict[str, Any] = {"categories": CATEGORIES}
    for s, split in enumerate(splits):
        folder = root / f"{split}2017"
        folder.mkdir(exist_ok=True)
        images, annotations, records = [], [], []
        ann_id = 1000 + 4000 * s
        for k, plan in enumerate(_image_plan(split)):
            width, height = plan["size"]
            image_id = 100 * (s + 1) + 7 * k  # not 0..N-1: targets must carry the json's ids
            canvas = np.zeros((height, width, 3), dtype=np.uint8)
            record = {"id": image_id, "file_name": f"{image_id:012d}{plan.get('ext', '.png')}",
                      "width": width, "height": height, "objects": [], "degenerate_ann_ids": []}
            for n, (digit, slot, kind) in enumerate(plan["objects"]):
                x, y = SLOTS[plan["size"]][slot]
                patch = digits[digit][(k + n) % len(digits[digit])]
                big = np.kron(patch, np.ones((SCALE, SCALE)))  # 0..16
                canvas[y:y + PATCH, x:x + PATCH] = (big * 15).astype(np.uint8)[..., None]
                square = np.zeros((height, width), dtype=bool)
                square[y:y + PATCH, x:x + PATCH] = True
                ink = np.zeros((height, width), dtype=bool)
                ink[y:y + PATCH, x:x + PATCH] = big > 0
                ann: dict[str, Any] = {"id": ann_id, "image_id": image_id,
                                       "category_id": CATEGORY_OF_DIGIT[digit], "iscrowd": int(kind == "crowd")}
                if kind == "polygon":
                    ann["segmentation"] = [[x, y, x + PATCH, y, x + PATCH, y + PATCH, x, y + PATCH]]
                    mask = square
                else:
                    ann["segmentation"] = _rle_uncompressed(ink) if kind == "crowd" else _rle_compressed(ink)
                    mask = ink
                rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
                box = [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)]
                ann["bbox"] = [box[0], box[1], box[2] - box[0], box[3] - box[1]]
                ann["area"] = float(mask.sum())
                annotations.append(ann)
                record["objects"].append({"ann_id": ann_id, "category_id": ann["category_id"], "box": box,
                                          "mask": mask, "iscrowd": ann["iscrowd"], "kind": kind})
                ann_id += 1
            if plan.get("degenerate"):  # 0.5 px wide once clipped to the image's right edge
                annotations.append({"id": ann_id, "image_id": image_id, "category_id": 3, "iscrowd": 0,
                                    "bbox": [width - 0.5, 10.0, 6.0, 8.0], "area": 4.0,
                                    "segmentation": [[width - 1, 10, width, 10, width, 18, width - 1, 18]]})
                record["degenerate_ann_ids"].append(ann_id)
                ann_id += 1
            Image.fromarray(canvas).save(folder / record["file_name"], quality=95)
            images.append({k2: record[k2] for k2 in ("id", "file_name", "width", "height")})
            records.append(record)
        data = {"info": {"description": "sklearn digits on canvases"}, "images": images,
                "annotations": annotations, "categories": CATEGORIES}
        (root / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(data))
        truth[split] = records
    return truth


@pytest.fixture(scope="session")
def coco_canvases(tmp_path_factory) -> CocoCanvases:
    """The digit canvases in the standard layout (shared: tests must not modify the files)."""
    root = tmp_path_factory.mktemp("coco_canvases")
    return CocoCanvases(root, write_coco_canvases(root))


@pytest.fixture
def coco_canvases_copy(tmp_path) -> CocoCanvases:
    """A private copy of the canvases, for tests that damage files."""
    root = tmp_path / "coco"
    return CocoCanvases(root, write_coco_canvases(root))


# ----------------------------------------------------------------------------- the quokka


def imgaug_wheel() -> Path:
    """The imgaug 0.4.0 wheel that ``make test`` downloaded (without its dependencies)."""
    wheel = TEST_DATA / IMGAUG_WHEEL
    if not wheel.is_file():
        pytest.fail(f"the quokka photo's wheel {wheel} is missing: `make test` downloads it, or run "
                    f"`{sys.executable} -m pip download --no-deps imgaug==0.4.0 -d {TEST_DATA}`", pytrace=False)
    return wheel


class Quokka(NamedTuple):
    annotation_file: Path
    image_folder: Path
    box: list[float]  # xyxy, from imgaug's json
    polygon: np.ndarray  # [39, 2] x, y
    size: tuple[int, int]  # width, height


@pytest.fixture(scope="session")
def quokka_coco(tmp_path_factory) -> Quokka:
    """imgaug's quokka photo with its box and polygon, as a one-image COCO set (category id 5)."""
    with zipfile.ZipFile(imgaug_wheel()) as wheel:
        photo = wheel.read("imgaug/quokka.jpg")
        meta = json.loads(wheel.read("imgaug/quokka_annotations.json"))
    root = tmp_path_factory.mktemp("quokka")
    (root / "images").mkdir()
    (root / "images" / "quokka.jpg").write_bytes(photo)
    with Image.open(root / "images" / "quokka.jpg") as im:
        width, height = im.size
    (b,) = meta["bounding_boxes"]
    box = [float(b["x1"]), float(b["y1"]), float(b["x2"]), float(b["y2"])]
    (poly,) = meta["polygons"]
    polygon = np.array([[p["x"], p["y"]] for p in poly["keypoints"]], dtype=np.float64)
    xs, ys = polygon[:, 0], polygon[:, 1]
    area = 0.5 * abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1)))  # shoelace
    data = {"images": [{"id": 42, "file_name": "quokka.jpg", "width": width, "height": height}],
            "annotations": [{"id": 1, "image_id": 42, "category_id": 5, "iscrowd": 0, "area": float(area),
                             "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]],
                             "segmentation": [polygon.flatten().tolist()]}],
            "categories": [{"id": 5, "name": b["label"]}]}
    annotation_file = root / "quokka.json"
    annotation_file.write_text(json.dumps(data))
    return Quokka(annotation_file, root / "images", box, polygon, (width, height))


@pytest.fixture
def coco_writer():
    """``write_coco_canvases(root, splits)``, for tests that build a set of their own."""
    return write_coco_canvases


__all__ = ["CocoCanvases", "Quokka", "write_coco_canvases", "CATEGORIES", "CATEGORY_OF_DIGIT"]
