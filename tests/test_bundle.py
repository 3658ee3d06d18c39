"""Harness bundles: the baselines load and pass their checks; a broken hook is rejected clearly."""

import shutil

import pytest

from envs.spec import SpecError, load_environment
from harness.bundle import BUNDLES, bundle_diff, load_bundle, resolve_bundle
from harness.check import check_bundle
from tests.conftest import FIXTURES


def copy(tmp_path, name="H0"):
    target = tmp_path / name
    shutil.copytree(BUNDLES / name, target)
    return target


def test_baselines_load_and_check():
    h0, prompt = load_bundle("H0"), load_bundle("H0-abstain-prompt")
    assert (h0.config.max_turns, h0.config.max_output_tokens) == (30, 8192)
    assert prompt.manifest.parent_id == "H0" and h0.hash != prompt.hash
    assert "cannot be completed" in prompt.prompts["system"] and "cannot be completed" not in h0.prompts["system"]
    assert check_bundle("H0") == [] and check_bundle("H0-abstain-prompt") == []


def test_hash_covers_every_file(tmp_path):
    bundle = copy(tmp_path)
    before = load_bundle(bundle).hash
    (bundle / "skills").mkdir()
    (bundle / "skills" / "note.md").write_text("Check the policy first.")
    assert load_bundle(bundle).hash != before


def test_bundles_that_differ_only_in_their_manifest_share_a_hash(tmp_path):
    """No episode reads the manifest: the same harness under another id and description is the same harness."""
    bundle = copy(tmp_path)
    (bundle / "manifest.yaml").write_text("id: c1\nparent_id: H0\norigin: fdcr\ndescription: Another name for H0.\n")
    (bundle / "prompts" / "system.md").write_text((bundle / "prompts" / "system.md").read_text() + "\n")
    changed = load_bundle(bundle).hash
    (bundle / "prompts" / "system.md").write_text((BUNDLES / "H0" / "prompts" / "system.md").read_text())
    assert load_bundle(bundle).hash == load_bundle("H0").hash != changed


def test_hash_covers_the_harness_library(tmp_path, monkeypatch):
    # a component whose code changed is a different harness: its cached rollouts must not be reused
    import harness.bundle

    bundle = copy(tmp_path)
    before = load_bundle(bundle).hash
    monkeypatch.setattr(harness.bundle, "LIBRARY_CODE", "another version of harness/components.py")
    harness.bundle._load_bundle.cache_clear()
    assert load_bundle(bundle).hash != before


def test_a_bundle_file_that_is_not_utf8_is_named(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "skills").mkdir()
    (bundle / "skills" / "logo.png").write_bytes(b"\x89PNG\r\n")
    for read in (load_bundle, lambda b: bundle_diff("H0", b)):
        with pytest.raises(SpecError) as info:
            read(bundle)
        assert (info.value.path.endswith("logo.png"), info.value.field) == (True, "(encoding)")


def test_hook_that_raises_is_rejected(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "hooks.py").write_text(
        "from harness.abi import BaseHarness\n\n"
        "class Harness(BaseHarness):\n"
        "    def finalize(self, view, answer):\n"
        "        return answer.missing_attribute\n"
    )
    problems = check_bundle(bundle)
    assert len(problems) == 1
    assert "hooks.py: Harness.finalize: raised AttributeError" in problems[0]


def test_hook_with_wrong_return_type_is_rejected(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "hooks.py").write_text(
        "from harness.abi import BaseHarness\n\n"
        "class Harness(BaseHarness):\n"
        "    def before_tool_call(self, view, call):\n"
        "        return 'allow'\n"
    )
    assert check_bundle(bundle) == [f"{bundle.resolve() / 'hooks.py'}: Harness.before_tool_call: returned str, expected Decision"]


def test_hook_with_wrong_signature_is_rejected(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "hooks.py").write_text(
        "from harness.abi import BaseHarness\n\n"
        "class Harness(BaseHarness):\n"
        "    def after_tool_result(self, view, observation):\n"
        "        return None\n"
    )
    with pytest.raises(SpecError) as info:
        load_bundle(bundle)
    assert info.value.field == "Harness.after_tool_result"
    assert "parameters (self, view, call, observation)" in info.value.expected


def test_hook_that_eats_memory_is_stopped(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "hooks.py").write_text(
        "from harness.abi import BaseHarness\n\n"
        "class Harness(BaseHarness):\n"
        "    def initialize(self, view):\n"
        "        view.memory['x'] = bytearray(4 << 30)\n"
    )
    assert "raised MemoryError" in check_bundle(bundle)[0]


def test_bad_config_and_missing_prompt(tmp_path):
    bundle = copy(tmp_path)
    (bundle / "config.yaml").write_text("max_turns: many\n")
    with pytest.raises(SpecError) as info:
        load_bundle(bundle)
    assert (info.value.path.endswith("config.yaml"), info.value.field) == (True, "max_turns")
    (bundle / "config.yaml").write_text("max_turns: 30\n")
    (bundle / "prompts" / "system.md").write_text("Hello $name\n")
    with pytest.raises(SpecError) as info:
        load_bundle(bundle)
    assert info.value.field == "(template)"


def test_a_directory_without_a_manifest_is_not_walked_as_a_bundle(tmp_path):
    """A mistyped path (`/`, say) is refused by its missing manifest before its files are listed; a bundle's link is
    named (tests/test_security.py: one could reach what the sandbox hides), and so is an environment's file that
    cannot be read (a link to nothing)."""
    with pytest.raises(SpecError, match="manifest.yaml: \\(file\\): a bundle's manifest; it does not exist"):
        load_bundle(tmp_path)
    bundle = tmp_path / "b"
    shutil.copytree(resolve_bundle("H0"), bundle)
    (bundle / "skills").mkdir(exist_ok=True)
    (bundle / "skills" / "gone.md").symlink_to(tmp_path / "nowhere.md")
    with pytest.raises(SpecError, match="gone.md: \\(file\\): a file or folder of its own, not a symbolic link"):
        load_bundle(bundle)
    env = tmp_path / "shop"
    shutil.copytree(FIXTURES / "shop", env)
    (env / "rows" / "gone.json").symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(SpecError, match="gone.json: \\(file\\): a readable file \\(No such file or directory\\)"):
        load_environment(env)
