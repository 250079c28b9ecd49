"""The perception targets (vlm.models.perception.targets): per-patch category boxes, object-centre counts,
readable light colours, occlusion, and the frame attributes once per image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlm.models.perception import PerceptionConfig
from vlm.models.perception.heads.grounding import GroundingHead
from vlm.models.perception.targets import (
    CENTRE_REGIONS,
    CHANNELS,
    FOOT_REGIONS,
    GROUPS,
    TargetTransform,
    channels,
    region_masks,
)
from vlm.models.perception.targets import scene_targets as grounding_targets
from vlm.models.siglip import SiglipVisionConfig
from vlm.scenes.schema import Scene, SceneObject


def channel(name: str) -> int:
    return CHANNELS.index(name)


def scene(*objects: SceneObject) -> Scene:
    return Scene(name="a.jpg", timeofday="daytime", weather="clear", scene="city street", objects=tuple(objects))


def test_boxes_centres_and_readable_lights_land_in_their_patches():
    car = SceneObject(id="1", category="car", box=(0.0, 360.0, 330.0, 719.0))  # left half of a 1280x720 frame
    red = SceneObject(id="2", category="traffic light", box=(1200.0, 10.0, 1270.0, 80.0), light_color="red")
    hidden = SceneObject(id="3", category="traffic light", box=(700.0, 10.0, 760.0, 80.0), light_color=None,
                         occluded=True)  # its lit lamp hidden: labelled with no colour
    t = grounding_targets(scene(car, red, hidden), 1280, 720, grid=4).reshape(4, 4, -1)
    assert t.shape[-1] == len(CHANNELS) == 44
    box = t[..., channel("box/car")]
    np.testing.assert_array_equal(box, [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
    centre = t[..., channel("centre/car")]  # centre (165, 539.5): row 2.997, column 0.52 (cells)
    assert centre.sum() == pytest.approx(1) and centre[2, 0] == pytest.approx(0.503, abs=1e-3)  # row 2's edge:
    assert centre[3, 0] == pytest.approx(0.497, abs=1e-3)  # shared with row 3; column 1 lies in other regions
    assert t[0, 3, channel("light/red")] == 1 and t[..., channel("light/red")].sum() == 1
    assert t[..., channel("light/green")].sum() == 0  # no colour: the answer rules cannot read it
    assert t[..., channel("box/traffic light")].sum() == 2  # but it is still a traffic light
    np.testing.assert_array_equal(t[..., channel("occluded")], t[..., channel("box/traffic light")] * [0, 0, 1, 0])


def test_centres_sharing_a_patch_are_counted():
    cars = [SceneObject(id=str(k), category="car", box=(10.0 + k, 10.0, 60.0 + k, 60.0)) for k in range(3)]
    t = grounding_targets(scene(*cars), 1280, 720, grid=4).reshape(4, 4, -1)
    assert t[0, 0, channel("centre/car")] == 3 and t[..., channel("centre/car")].sum() == 3
    assert t[0, 0, channel("box/car")] == 1  # coverage stays 0/1


def test_mirror_reverses_patch_columns():
    car = SceneObject(id="1", category="car", box=(0.0, 0.0, 100.0, 100.0))
    t = grounding_targets(scene(car), 1280, 720, grid=4)
    flipped = grounding_targets(scene(SceneObject(id="1", category="car", box=(1180.0, 0.0, 1280.0, 100.0))),
                                1280, 720, grid=4)
    np.testing.assert_allclose(TargetTransform(4, (1280, 720)).mirror(t), flipped, atol=1e-6)



def test_frame_attributes_fill_every_patch_and_undefined_ones_are_minus_one():
    foggy_night = Scene(name="a.jpg", timeofday="night", weather="foggy", scene="undefined", objects=())
    t = grounding_targets(foggy_night, 1280, 720, grid=4)
    assert CHANNELS[-len(GROUPS["frame"]):] == GROUPS["frame"] == (
        "frame/night", "frame/rain", "frame/fog", "frame/highway")
    frame = t[:, -len(GROUPS["frame"]):]
    np.testing.assert_array_equal(frame, np.tile([1, 0, 1, -1], (16, 1)))  # highway: the scene is undefined
    assert t[:, :-len(GROUPS["frame"])].sum() == 0  # no objects


def test_heatmaps_peak_at_each_centre_and_pool_back_to_the_patch_grid():
    near = SceneObject(id="1", category="car", box=(0.0, 360.0, 330.0, 719.0))
    far = SceneObject(id="2", category="car", box=(600.0, 300.0, 640.0, 340.0))
    t = grounding_targets(scene(near, far), 1280, 720, grid=16).reshape(16, 16, -1)
    heat = t[..., channel("heat/car")]
    assert heat.max() == 1 and (heat == 1).sum() == 2  # one peak cell per object
    assert heat[int(539.5 / 720 * 16), int(165 / 1280 * 16)] == 1 and heat[7, 7] == 1
    assert 0 < heat[8, 7] < 0.5 and heat[0, 15] < 1e-3  # a Gaussian around the small car, ~0 far away
    assert t[..., channel("heat/pedestrian")].sum() == 0
    foot = t[..., channel("foot/road_user")]  # around the bottom-centres: (165, 719) and (620, 340)
    assert foot[15, 2] == 1 and foot[7, 7] == 1 and (foot == 1).sum() == 2
    assert t[..., channel("foot/vulnerable")].sum() == 0 and t[..., channel("foot/occluded")].sum() == 0
    coarse = grounding_targets(scene(near, far), 1280, 720, grid=4)
    head = GroundingHead(PerceptionConfig(), SiglipVisionConfig(hidden_size=8, num_attention_heads=2))
    pooled = head.patch_targets(torch.from_numpy(t.reshape(1, 256, -1)), grid=4)[0].numpy()
    # boxes, lights and occlusion by max; centre counts by sum (the cells' shares, not the coarse grid's)
    np.testing.assert_array_equal(np.delete(pooled, channels("centre"), axis=1),
                                  np.delete(coarse[:, :pooled.shape[1]], channels("centre"), axis=1))
    centres = t[..., channels("centre")].reshape(4, 4, 4, 4, -1).sum(axis=(1, 3)).reshape(16, -1)
    np.testing.assert_allclose(pooled[:, channels("centre")], centres, atol=1e-6)


def test_a_centre_is_shared_with_the_neighbour_it_lies_towards_within_its_regions():
    """The centre counts move with an object smoothly, split bilinearly between its cell and the neighbour it lies
    towards, but never across the edge of a region objects are counted in (a third of the image)."""
    grid = (4, 12)  # cells of 106.7 x 180 frame px; each third of the image 4 columns

    def centre(x: float, y: float) -> np.ndarray:  # the car centred at (x, y) frame px
        car = SceneObject(id="1", category="car", box=(x - 20, y - 20, x + 20, y + 20))
        return grounding_targets(scene(car), 1280, 720, grid=grid).reshape(*grid, -1)[..., channel("centre/car")]

    at_centre = centre(160, 270)  # the centre of cell (1, 1)
    assert at_centre[1, 1] == 1 and at_centre.sum() == 1
    moved = centre(160 + 0.25 * 1280 / 12, 270 + 0.125 * 720 / 4)  # a quarter cell right, an eighth down
    expected = np.zeros(grid)
    expected[1:3, 1:3] = np.outer([0.875, 0.125], [0.75, 0.25])
    np.testing.assert_allclose(moved, expected, atol=1e-6)
    at_edge = centre(3.8 * 1280 / 12, 270)  # towards column 4, the middle third: the left third keeps it
    assert at_edge[1, 3] == 1 and at_edge.sum() == 1


def test_every_region_sum_of_the_centre_counts_is_the_labels_count():
    """However the centres are shared among cells, each region's sum (the image, its thirds; the paths' near parts
    for the footpoints) is the number of centres in its cells, as the answers' rules count them."""
    rng = np.random.default_rng(0)
    grid = (32, 56)
    corners = rng.uniform([0, 0], [1240, 680], size=(60, 2))
    cars = [SceneObject(id=str(i), category="car", box=(x, y, x + 40, y + 40)) for i, (x, y) in enumerate(corners)]
    t = torch.from_numpy(grounding_targets(scene(*cars), 1280, 720, grid=grid))  # [cells, C]
    for group, regions in (("centre", CENTRE_REGIONS), ("feet", FOOT_REGIONS)):
        x, y = corners[:, 0] + 20, corners[:, 1] + (20 if group == "centre" else 40)  # centres or footpoints
        cells = (np.minimum(y / 720 * grid[0], grid[0] - 1).astype(int) * grid[1]
                 + np.minimum(x / 1280 * grid[1], grid[1] - 1).astype(int))
        masks = region_masks([regions], grid).flatten(2)[0]  # [R, cells]
        name = "centre/car" if group == "centre" else "feet/road_user"
        sums = masks.float() @ t[:, channel(name)]  # [R]
        labels = masks[:, cells].sum(dim=1).float()  # [R]: the centres whose own cell lies in the region
        assert sums.sum() > 0
        torch.testing.assert_close(sums, labels, atol=1e-4, rtol=0)


def test_footpoints_of_pedestrians_and_occluded_road_users():
    walker = SceneObject(id="1", category="pedestrian", box=(600.0, 500.0, 640.0, 700.0), occluded=True)
    sign = SceneObject(id="2", category="traffic sign", box=(100.0, 100.0, 140.0, 140.0), occluded=True)
    t = grounding_targets(scene(walker, sign), 1280, 720, grid=16).reshape(16, 16, -1)
    for group in ("road_user", "vulnerable", "occluded"):  # a sign is not a road user
        heat = t[..., channel(f"foot/{group}")]
        assert heat[15, 7] == 1 and (heat == 1).sum() == 1, group
        feet = t[..., channel(f"feet/{group}")]  # the footpoint counted in its cell, nowhere else
        assert feet[15, 7] == 1 and feet.sum() == 1, group
    two = scene(walker, SceneObject(id="3", category="pedestrian", box=(610.0, 520.0, 630.0, 700.0)))
    assert grounding_targets(two, 1280, 720, grid=16).reshape(16, 16, -1)[15, 7, channel("feet/vulnerable")] == 2


def test_a_rectangular_grid_puts_each_centre_in_its_cell_and_mirrors_its_columns():
    car = SceneObject(id="1", category="car", box=(900.0, 400.0, 1000.0, 500.0))  # centre (950, 450) of 1280x720
    t = grounding_targets(scene(car), 1280, 720, grid=(4, 7)).reshape(4, 7, -1)  # 4 rows, 7 columns
    centre = t[..., channel("centre/car")]
    assert centre.sum() == 1 and centre[2, 5] == 1  # row 450/720*4 = 2.5 -> 2, column 950/1280*7 = 5.2 -> 5
    heat = t[..., channel("heat/car")]
    assert heat[2, 5] == 1 and heat.max() == 1
    transform = TargetTransform((4, 7), (1280, 720))
    assert transform.num_cells == 28 and transform.bytes_per_image == 28 * len(CHANNELS) * 4
    mirrored = SceneObject(id="1", category="car", box=(280.0, 400.0, 380.0, 500.0))
    np.testing.assert_allclose(transform.mirror(t.reshape(28, -1)),
                               grounding_targets(scene(mirrored), 1280, 720, grid=(4, 7)), atol=1e-6)


def test_grounding_pools_a_finer_rectangular_grid_to_its_patches():
    head = GroundingHead(PerceptionConfig(heads={"grounding": 1.0}),
                         SiglipVisionConfig(hidden_size=8, image_size=32, image_width=64, patch_size=8))
    cars = [SceneObject(id=str(k), category="car", box=(700.0 + 10 * k, 10.0, 740.0 + 10 * k, 60.0)) for k in range(2)]
    fine = grounding_targets(scene(*cars), 1280, 720, grid=(8, 16))  # stride 4 over 32 x 64 px
    pooled = head.patch_targets(torch.from_numpy(fine[None]), head.grid)[0].numpy().reshape(4, 8, -1)
    assert pooled[0, 4, channel("centre/car")] == 2 and pooled[..., channel("centre/car")].sum() == 2
