"""GPUSliceKubeSpawner beside KubeSpawner's own profile_list (issue 46): a Zero-to-JupyterHub
site's image choice and the GPU slice in one spawn form, and a pod with both.

No cluster: the spawn form, ``run_options_from_form`` and the start run for real, the
gpuslice service answers with recorded responses, and KubeSpawner's start is replaced by what
it does before it sends the pod (``load_user_options()``, then ``get_pod_manifest()``), whose
manifest is schema-checked as in test_kubernetes_spawner.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from traitlets.config import Config

from tests.harness.engines import need_module

kubespawner_module = need_module("kubespawner.spawner")

from kubernetes_asyncio.client import ApiClient  # noqa: E402
from kubespawner import KubeSpawner  # noqa: E402

from gpuslice_hub.client import ServiceClient  # noqa: E402
from gpuslice_spawner.kubernetes import GPUSliceKubeSpawner  # noqa: E402
from gpuslice_spawner.spawner import SliceRefused  # noqa: E402
from tests.spawner.test_launchers_kubernetes import MIG_GRANT, SHARE_GRANT, validate  # noqa: E402

SCIPY = "quay.io/jupyter/scipy-notebook:2024-12-02"
TORCH_24 = "quay.io/jupyter/pytorch-notebook:cuda12-pytorch-2.4.1"
TORCH_25 = "quay.io/jupyter/pytorch-notebook:cuda12-pytorch-2.5.1"

# What a Zero-to-JupyterHub site offers: images, one with versions to pick from. The
# PyTorch profile also asks for a GPU of its own, as such sites' profiles do: the slice
# gpuslice grants must win over it.
PROFILE_LIST = [
    {
        "display_name": "Python (SciPy)",
        "slug": "python",
        "default": True,
        "kubespawner_override": {"image": SCIPY},
    },
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "1"}},
        "profile_options": {
            "image": {
                "display_name": "Version",
                "choices": {
                    "2.4": {
                        "display_name": "PyTorch 2.4",
                        "kubespawner_override": {"image": TORCH_24},
                    },
                    "2.5": {
                        "display_name": "PyTorch 2.5",
                        "default": True,
                        "kubespawner_override": {"image": TORCH_25},
                    },
                },
            }
        },
    },
]

# GET api/profiles, as the service answers it for alice
PROFILES_ANSWER = {
    "user": "alice",
    "simulated": False,
    "quota": [],
    "profiles": [
        {
            "name": "mig-1g.18gb",
            "display_name": "Small MIG slice",
            "kind": "mig",
            "description": "MIG 1g.18gb instance of an H100",
            "allowed": True,
            "available": True,
            "free": 3,
            "total": 7,
            "idle": {"timeout": 3600, "action": "kernel"},
        },
        {
            "name": "share-250",
            "display_name": "Quarter GPU",
            "kind": "share",
            "description": "a quarter of an A100, 10 GiB GPU memory cap",
            "allowed": True,
            "available": True,
            "free": 4,
            "total": 4,
            "idle": {"timeout": 1800, "action": "server"},
        },
    ],
}


class FormFields(HTMLParser):
    """The fields a browser would submit from the form: radio groups and selects."""

    def __init__(self) -> None:
        super().__init__()
        self.radios: dict[str, list[str]] = {}
        self.selects: dict[str, list[str]] = {}
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "input" and a.get("type") == "radio":
            self.radios.setdefault(a["name"] or "", []).append(a["value"] or "")
        elif tag == "select":
            self._select = a["name"]
            self.selects[self._select or ""] = []
        elif tag == "option" and self._select:
            self.selects[self._select].append(a["value"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


@pytest.fixture
def make_spawner() -> Iterator[Any]:
    # (as in test_kubernetes_spawner.py: no kubeconfig, no API client, no cluster)
    with (
        mock.patch.object(kubespawner_module, "load_config"),
        mock.patch.object(kubespawner_module, "shared_client"),
    ):

        def make(**traits: Any) -> GPUSliceKubeSpawner:
            user = SimpleNamespace(name="alice", id=7, url="/user/alice/", groups=[])
            return GPUSliceKubeSpawner(
                _mock=True,
                user=user,
                image="quay.io/jupyter/base-notebook:2024-12-02",
                cmd=["jupyterhub-singleuser"],
                # the device plugin's time-slicing: a quarter GPU is one of 4 replicas
                config=Config({"KubernetesResourcesConfig": {"time_slicing_replicas": 4}}),
                **traits,
            )

        yield make


class RecordedService:
    """The gpuslice service's recorded answers to the spawner's calls."""

    def __init__(self, grant: dict[str, Any]) -> None:
        self.grant = grant
        self.asked: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        self.asked.append((method, path, body))
        if (method, path) == ("GET", "api/profiles"):
            return PROFILES_ANSWER
        if (method, path) == ("GET", "api/allocations"):
            return {"allocations": []}
        if (method, path) == ("POST", "api/allocations"):
            return self.grant
        raise AssertionError(f"unexpected call {method} {path}")

    def allocated(self) -> list[str]:
        return [body["profile"] for method, path, body in self.asked if method == "POST"]


@pytest.fixture
def service() -> Any:
    def make(grant: dict[str, Any]) -> RecordedService:
        recorded = RecordedService(grant)

        async def request(_client: Any, *args: Any, **kw: Any) -> Any:
            return await recorded.request(*args, **kw)

        patcher = mock.patch.object(ServiceClient, "request", request)
        patcher.start()
        made.append(patcher)
        return recorded

    made: list[Any] = []
    yield make
    for patcher in made:
        patcher.stop()


async def start_and_capture_pod(spawner: Any) -> dict[str, Any]:
    """The spawner's start(), with KubeSpawner's start() doing what it does before it sends
    the pod to the API server."""
    sent: list[dict[str, Any]] = []

    async def kubespawner_start(self: Any) -> tuple[str, int]:
        await self.load_user_options()
        pod = await self.get_pod_manifest()
        async with ApiClient() as api:
            sent.append(api.sanitize_for_serialization(pod))
        return ("10.0.0.7", 8888)

    with mock.patch.object(KubeSpawner, "start", kubespawner_start):
        assert await spawner.start() == ("10.0.0.7", 8888)
    (pod,) = sent
    validate(pod, "latest")
    return pod


@pytest.mark.parametrize(
    "form, grant, image, limits",
    [
        (
            {
                "slice": ["mig-1g.18gb"],
                "profile": ["pytorch"],
                "profile-option-pytorch--image": ["2.4"],
            },
            MIG_GRANT,
            TORCH_24,
            {"nvidia.com/mig-1g.18gb": "1"},
        ),
        (
            {"slice": ["share-250"], "profile": ["python"]},
            SHARE_GRANT,
            SCIPY,
            {"nvidia.com/gpu.shared": "1"},
        ),
    ],
    ids=["pytorch-2.4-on-mig", "python-on-a-share"],
)
async def test_images_and_slices_in_one_form_and_one_pod(
    make_spawner: Any,
    service: Any,
    form: dict[str, list[str]],
    grant: dict[str, Any],
    image: str,
    limits: dict[str, str],
):
    recorded = service(grant)
    spawner = make_spawner(profile_list=PROFILE_LIST)
    html = await spawner.get_options_form()
    fields = FormFields()
    fields.feed(html)
    # both choices in one form: the slices, then KubeSpawner's profiles and their options
    assert fields.radios == {
        "slice": ["mig-1g.18gb", "share-250"],
        "profile": ["python", "pytorch"],
    }
    assert fields.selects == {"profile-option-pytorch--image": ["2.4", "2.5"]}
    assert html.index('name="slice"') < html.index('id="kubespawner-profiles-list"')
    assert "Quarter GPU" in html and "4 of 4 free" in html and "PyTorch 2.5" in html

    # what the hub does with the submitted form: gpuslice's field, then KubeSpawner's parser
    spawner.user_options = await spawner.run_options_from_form(form)
    expected = {"slice": form["slice"][0], "profile": form["profile"][0]}
    if "profile-option-pytorch--image" in form:
        expected["image"] = form["profile-option-pytorch--image"][0]
    assert spawner.user_options == expected

    pod = await start_and_capture_pod(spawner)
    container = pod["spec"]["containers"][0]
    assert container["image"] == image
    # the slice's resources, not the profile's own nvidia.com/gpu
    assert container["resources"]["limits"] == limits
    assert container["resources"]["requests"] == limits
    assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == grant["host"]
    assert pod["metadata"]["labels"]["gpuslice.dev/allocation-id"] == str(grant["id"])
    assert recorded.allocated() == [form["slice"][0]]


@pytest.mark.parametrize(
    "options, needle",
    [
        # KubeSpawner's choice is a profile_list slug, never a GPU slice
        ({"profile": "share-250"}, "No GPU slice was chosen"),
        ({"slice": "share-250", "profile": "cuda-everything"}, "No such profile: cuda-everything"),
        ({"slice": "share-250", "profile": "pytorch", "image": "evil"}, "has no choice 'evil'"),
        ({"slice": "share-250", "profile": "pytorch", "image": ["2.4"]}, "must be a string"),
        (
            {"slice": "share-250", "profile": "pytorch", "image--unlisted-choice": "x/y:z"},
            "without being enabled",
        ),
        ({"slice": "share-250", "cmd": "sh"}, "Unknown spawn option 'cmd'"),
    ],
)
async def test_forged_options_are_refused_before_a_slice_is_taken(
    make_spawner: Any, service: Any, options: dict[str, Any], needle: str
):
    recorded = service(SHARE_GRANT)
    spawner = make_spawner(profile_list=PROFILE_LIST)
    spawner.user_options = options
    with pytest.raises(SliceRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 400 and needle in refused.value.message
    assert recorded.allocated() == []


async def test_without_a_profile_list_profile_still_names_the_slice(
    make_spawner: Any, service: Any
):
    """API callers from before "slice" (``{"profile": "share-250"}``) keep working where no
    profile_list gives "profile" another meaning; the form has only the slice choice."""
    recorded = service(SHARE_GRANT)
    spawner = make_spawner()
    fields = FormFields()
    fields.feed(await spawner.get_options_form())
    assert fields.radios == {"slice": ["mig-1g.18gb", "share-250"]}
    spawner.user_options = {"profile": "share-250"}
    pod = await start_and_capture_pod(spawner)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
    assert recorded.allocated() == ["share-250"]
    # the hub offers the spawn form (its admin page too): there is one, the slice's
    assert spawner.options_form
