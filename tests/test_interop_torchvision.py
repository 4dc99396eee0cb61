"""torchvision ViT state dicts (packed in_proj_weight) load with torchvision's logits."""

import pytest
import torch
from interop_helpers import randomised

import vitkit
from vitkit.evaluate.preprocessing import checkpoint_transform

torchvision = pytest.importorskip("torchvision")


@pytest.mark.parametrize("representation_size", [None, 48])
def test_torchvision_state_dicts_give_torchvisions_logits(tmp_path, representation_size):
    peer = randomised(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10,
        representation_size=representation_size))
    torch.save(peer.state_dict(), tmp_path / "tv.pth")
    with pytest.raises(vitkit.CheckpointError, match="num_heads="):
        vitkit.load(tmp_path / "tv.pth")
    model = vitkit.load(tmp_path / "tv.pth", num_heads=4)
    assert model.config.representation_size == representation_size
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), peer(x), atol=1e-5, rtol=0)
    reference = torchvision.transforms._presets.ImageClassification(crop_size=32)  # what its weights expect
    normalize = checkpoint_transform(model.config).per_batch
    assert (list(normalize.mean), list(normalize.std)) == (reference.mean, reference.std)


def test_fine_tuning_resolution_matches_torchvisions_interpolate_embeddings(tmp_path):
    """Loaded at a larger size, the position table is resampled like torchvision's own
    ``interpolate_embeddings`` (bicubic, corners aligned), so logits agree at the new resolution."""
    from torchvision.models.vision_transformer import interpolate_embeddings

    small = randomised(torchvision.models.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=10))
    torch.save(small.state_dict(), tmp_path / "tv.pth")
    big = torchvision.models.VisionTransformer(image_size=56, patch_size=8, num_layers=2, num_heads=4,
                                               hidden_dim=64, mlp_dim=128, num_classes=10).eval()
    big.load_state_dict(interpolate_embeddings(56, 8, small.state_dict()))
    model = vitkit.load(tmp_path / "tv.pth", num_heads=4, image_size=56)
    x = torch.randn(2, 3, 56, 56)
    with torch.no_grad():
        torch.testing.assert_close(model(x), big(x), atol=1e-5, rtol=0)
