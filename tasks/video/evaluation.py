"""Multi-view video evaluation at Kinetics scale: what it keeps, and how ranks combine it.

The standard protocol (SlowFast's 10 clips x 3 crops) averages the softmax of all views of a video
and reports video-level top-1/top-5, next to clip-level (each view on its own) accuracy and the
loss per view. Only the first needs anything per video: the sum of the softmax over its views.
:class:`MultiViewAccuracy` keeps exactly that, densely (``[videos, classes]`` float32, with the
view count, label, loss sum and clip-level hits per video and one byte per (video, clip) to count
each item once). A video the data set dropped part-way (a clip that could not be decoded, after
others were counted) is left out of every number (:meth:`MultiViewAccuracy.drop`), as the data
report says it was skipped, never scored on the views that happened to decode. Kinetics-400's
20k test videos x 10 x 3 views take ~32 MB (``tests/tasks/video/test_video_evaluation.py`` measures it), where a record per view or
per (video, clip) took several hundred.

Under DDP every rank holds the sums of the items it saw; :meth:`MultiViewAccuracy.compute` reduces
them onto rank 0 (one sum, not a gather of every record onto every rank), which computes the
metrics and broadcasts the few numbers, so all ranks log the same values (``predict`` keeps the
same sums: :meth:`MultiViewAccuracy.videos` hands rank 0 each video's softmax averaged over its
views, as the video-level accuracy ranks it). Sums can only be reduced if no item was seen twice:
the data module shards evaluation without repeats
(:class:`~rescale_tasks.common.data.UnrepeatedSampler`), or, under a strategy that shards the
parameters, marks the padding the module leaves out (:func:`~rescale_tasks.common.data.eval_sampler`);
an item met by two ranks all the same is one clear error, never a silently double-counted view.
"""
from __future__ import annotations

import torch

from rescale_tasks.common.errors import DataError
from rescale_tasks.common.system import (broadcast_from_rank_zero, max_over_ranks, rank,
                                         reduce_tensor_to_rank_zero)

__all__ = ["MultiViewAccuracy"]


class MultiViewAccuracy:
    """Video- and clip-level top-k accuracy and the mean loss per view of a multi-view evaluation.

    ``update`` once per batch of items (a clip of a video with all its crops); ``compute`` at the
    end (a collective under DDP); ``reset`` before the next evaluation.
    """

    GROWTH = 1.25  # rows are added in steps of a quarter (amortised copies, little slack)

    def __init__(self, top: tuple[int, ...] = (1, 5)) -> None:
        self.top = tuple(top)
        self.reset()

    def reset(self) -> None:
        self.probs = torch.zeros(0, 0)  # [videos, classes]: softmax summed over the video's views
        self.views = torch.zeros(0, dtype=torch.int64)  # [videos]
        self.labels = torch.full((0,), -1, dtype=torch.int64)  # [videos], -1: not seen
        self.seen = torch.zeros(0, 0, dtype=torch.uint8)  # [videos, clips]: items counted here
        self.losses = torch.zeros(0, dtype=torch.float64)  # [videos]: the loss summed over its views
        self.hits = torch.zeros(0, len(self.top), dtype=torch.float64)  # [videos, k]: its views right at top-k
        self.dropped = torch.zeros(0, dtype=torch.uint8)  # [videos]: 1 = left out (the data set dropped it)

    def nbytes(self) -> int:
        """Bytes held (every tensor of the state)."""
        return sum(t.element_size() * t.nelement() for t in (self.probs, self.views, self.labels, self.seen,
                                                              self.losses, self.hits, self.dropped))

    def _grow(self, videos: int, clips: int, classes: int) -> None:
        rows, cols = self.seen.shape
        if videos <= rows and clips <= cols and classes == self.probs.shape[1]:
            return
        if classes != self.probs.shape[1] and rows:
            raise ValueError(f"class count changed from {self.probs.shape[1]} to {classes} within one evaluation")
        new_rows = max(videos, int(rows * self.GROWTH) + 1) if videos > rows else rows
        self.probs = _grown(self.probs, (new_rows, classes))
        self.views, self.labels = _grown(self.views, (new_rows,)), _grown(self.labels, (new_rows,), fill=-1)
        self.losses, self.hits = _grown(self.losses, (new_rows,)), _grown(self.hits, (new_rows, len(self.top)))
        self.seen = _grown(self.seen, (new_rows, max(clips, cols)))

    def drop(self, dropped: torch.Tensor) -> None:
        """Leave out the videos flagged in ``dropped`` (bool, one per video of the data set: those it
        dropped, some of whose views may have been counted before a later clip failed) from every
        number, on any rank (the flags of all ranks are combined)."""
        dropped = torch.as_tensor(dropped).flatten().to(torch.uint8)
        if len(dropped) > len(self.dropped):
            self.dropped = _grown(self.dropped, (len(dropped),))
        self.dropped[:len(dropped)] |= dropped.clamp(max=1)

    def update(self, probs: torch.Tensor, labels: torch.Tensor, videos: torch.Tensor, clips: torch.Tensor,
               losses: torch.Tensor) -> None:
        """``probs`` ``(n, crops, classes)``: the softmax of every view of ``n`` items; ``labels``,
        ``videos``, ``clips``, ``losses`` (the loss summed over the item's crops) ``(n,)``. An item
        (video, clip) already counted on this rank is left out."""
        if not len(videos):
            return
        probs = probs.detach().float().cpu()
        labels, videos, clips = (t.detach().cpu().long() for t in (labels, videos, clips))
        losses = losses.detach().double().cpu()
        self._grow(int(videos.max()) + 1, int(clips.max()) + 1, probs.shape[-1])
        keep = self.seen[videos, clips] == 0
        key = videos * self.seen.shape[1] + clips  # and each key once within the batch
        _, inverse = torch.unique(key, return_inverse=True)
        first = torch.full((int(inverse.max()) + 1,), len(key)).scatter_reduce(0, inverse, torch.arange(len(key)),
                                                                               "amin")
        keep &= torch.zeros(len(key), dtype=torch.bool).index_fill_(0, first, True)
        if not keep.all():
            probs, labels, videos, clips, losses = (t[keep] for t in (probs, labels, videos, clips, losses))
        n, crops = probs.shape[:2]
        self.seen[videos, clips] = 1
        self.probs.index_add_(0, videos, probs.sum(1))
        self.views.index_add_(0, videos, torch.full((n,), crops, dtype=torch.int64))
        self.labels[videos] = labels
        ranked = probs.topk(min(max(self.top), probs.shape[-1]), dim=-1).indices == labels.view(n, 1, 1)
        hits = torch.stack([ranked[..., :k].any(-1).sum(1) for k in self.top], 1).double()  # [n, k]
        self.losses.index_add_(0, videos, losses)
        self.hits.index_add_(0, videos, hits)

    def _reduced(self) -> tuple[torch.Tensor, ...]:
        """``(probs, views, labels, counted, losses, hits)`` of every rank, reduced onto rank 0 (a
        collective: sizes agreed, sums reduced in place), the videos some rank dropped left out (no
        views); only rank 0's are meaningful."""
        videos = max_over_ranks(self.seen.shape[0])
        clips, classes = max_over_ranks(self.seen.shape[1]), max_over_ranks(self.probs.shape[1])
        self._grow(videos, clips, classes if not self.seen.shape[0] else self.probs.shape[1])
        n = videos  # rows beyond the agreed size are zero slack of the growth
        probs = reduce_tensor_to_rank_zero(self.probs[:n].contiguous())
        views = reduce_tensor_to_rank_zero(self.views[:n].clone())
        labels = reduce_tensor_to_rank_zero(self.labels[:n].clone(), op="max")
        counted = reduce_tensor_to_rank_zero(self.seen[:n].to(torch.int32))
        losses = reduce_tensor_to_rank_zero(self.losses[:n].clone())
        hits = reduce_tensor_to_rank_zero(self.hits[:n].clone())
        dropped = reduce_tensor_to_rank_zero(_grown(self.dropped[:n], (n,)), op="max").bool()
        views[dropped] = 0
        return probs, views, labels, counted, losses, hits

    @staticmethod
    def _refuse_repeats(repeated: int) -> None:
        if repeated:
            raise DataError(f"{repeated} evaluation item(s) (video, clip) reached more than one process, so their "
                            "views would count twice; shard evaluation without repeats (rescale_tasks.common."
                            "data.eval_sampler, as KineticsDataModule does)")

    def compute(self) -> dict[str, float]:
        """``acc<k>`` (video level), ``clip_acc<k>``, ``loss`` (per view), ``videos``, ``views``
        over every rank: a collective under DDP (sizes agreed, sums reduced onto rank 0 in place,
        which computes and broadcasts the numbers). The state is spent: it is reset afterwards."""
        probs, views, labels, counted, losses, hits = self._reduced()
        names = [f"acc{k}" for k in self.top] + [f"clip_acc{k}" for k in self.top] + ["loss", "videos", "views",
                                                                                        "repeated"]
        numbers = torch.zeros(len(names), dtype=torch.float64)
        if rank() == 0:
            present = views > 0
            total_views = float(views[present].sum())
            for i, k in enumerate(self.top):
                if probs.shape[1] and present.any():  # the mean over views ranks classes as the sum does
                    top = probs[present].topk(min(k, probs.shape[1]), dim=-1).indices
                    numbers[i] = float((top == labels[present].unsqueeze(1)).any(1).sum()) / float(present.sum())
                numbers[len(self.top) + i] = float(hits[present, i].sum()) / max(total_views, 1.0)
            numbers[-4:] = torch.tensor([float(losses[present].sum()) / max(total_views, 1.0), float(present.sum()),
                                         total_views, float((counted > 1).sum())], dtype=torch.float64)
        numbers = broadcast_from_rank_zero(numbers)
        self.reset()
        metrics = dict(zip(names, numbers.tolist()))
        self._refuse_repeats(int(metrics.pop("repeated")))
        return metrics

    def videos(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(video, probs, labels, views)`` of every video seen on any rank, in video order: its
        index, its softmax averaged over all its views (what the video-level accuracy ranks), its
        label and view count; on rank 0 (a collective under DDP: the sums reduced there), empty
        on the others. The state is spent: it is reset afterwards."""
        probs, views, labels, counted, _, _ = self._reduced()
        repeated = torch.tensor([int((counted > 1).sum()) if rank() == 0 else 0], dtype=torch.int64)
        repeated = int(broadcast_from_rank_zero(repeated).item())
        self.reset()
        self._refuse_repeats(repeated)
        if rank() != 0:
            return (torch.zeros(0, dtype=torch.int64), torch.zeros(0, probs.shape[1]),
                    torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        video = (views > 0).nonzero().flatten()
        return video, probs[video] / views[video].unsqueeze(1), labels[video], views[video]


def _grown(values: torch.Tensor, shape: tuple[int, ...], fill: float = 0) -> torch.Tensor:
    """A new tensor of ``shape`` (no smaller than ``values``' in any dimension it has rows in), ``fill``
    everywhere but its leading corner, which holds ``values``: the per-video state grown by rows (and
    clips), and the dropped flags grown to the data set's videos."""
    grown = torch.full(shape, fill, dtype=values.dtype)
    if values.numel():
        grown[tuple(slice(0, size) for size in values.shape)] = values
    return grown
