"""Copies of shared/fixtures/kubernetes/extender-*.json, so the suite needs nothing outside the repository.

``FILTER_REQUEST`` is the ExtenderArgs kube-scheduler sends with ``nodeCacheCapable: true`` (a full Pod and
``NodeNames``; ``Nodes`` null). The shared originals were hand-built against the Go types; the test below
checks these copies against them where shared/ is present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "kubernetes"

FILTER_REQUEST_JSON = """
{
 "Pod": {
  "metadata": {
   "name": "llm-train-7d9c6b8f5d-x2kqp",
   "generateName": "llm-train-7d9c6b8f5d-",
   "namespace": "ml-team",
   "uid": "0f6b3c2a-9e1d-4c7b-8a5e-2d4f6a8b0c1e",
   "resourceVersion": "48213377",
   "creationTimestamp": "2026-08-07T10:15:42Z",
   "labels": {
    "app": "llm-train",
    "pod-template-hash": "7d9c6b8f5d"
   },
   "annotations": {
    "gpu-agent.example.com/min-free-memory-mib": "40000",
    "gpu-agent.example.com/exclusive": "true"
   },
   "ownerReferences": [
    {
     "apiVersion": "apps/v1",
     "kind": "ReplicaSet",
     "name": "llm-train-7d9c6b8f5d",
     "uid": "5a1e7c3b-2d4f-4e6a-9b8c-7d6e5f4a3b2c",
     "controller": true,
     "blockOwnerDeletion": true
    }
   ]
  },
  "spec": {
   "volumes": [
    {
     "name": "kube-api-access-8xk2m",
     "projected": {
      "sources": [
       {
        "serviceAccountToken": {
         "expirationSeconds": 3607,
         "path": "token"
        }
       },
       {
        "configMap": {
         "name": "kube-root-ca.crt",
         "items": [
          {
           "key": "ca.crt",
           "path": "ca.crt"
          }
         ]
        }
       },
       {
        "downwardAPI": {
         "items": [
          {
           "path": "namespace",
           "fieldRef": {
            "apiVersion": "v1",
            "fieldPath": "metadata.namespace"
           }
          }
         ]
        }
       }
      ],
      "defaultMode": 420
     }
    }
   ],
   "containers": [
    {
     "name": "trainer",
     "image": "nvcr.io/nvidia/pytorch:24.05-py3",
     "command": [
      "python",
      "train.py"
     ],
     "resources": {
      "limits": {
       "cpu": "8",
       "memory": "64Gi",
       "nvidia.com/gpu": "1"
      },
      "requests": {
       "cpu": "4",
       "memory": "32Gi",
       "nvidia.com/gpu": "1"
      }
     },
     "volumeMounts": [
      {
       "name": "kube-api-access-8xk2m",
       "readOnly": true,
       "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"
      }
     ],
     "terminationMessagePath": "/dev/termination-log",
     "terminationMessagePolicy": "File",
     "imagePullPolicy": "IfNotPresent"
    }
   ],
   "restartPolicy": "Always",
   "terminationGracePeriodSeconds": 30,
   "dnsPolicy": "ClusterFirst",
   "serviceAccountName": "default",
   "serviceAccount": "default",
   "securityContext": {},
   "schedulerName": "default-scheduler",
   "tolerations": [
    {
     "key": "nvidia.com/gpu",
     "operator": "Exists",
     "effect": "NoSchedule"
    },
    {
     "key": "node.kubernetes.io/not-ready",
     "operator": "Exists",
     "effect": "NoExecute",
     "tolerationSeconds": 300
    },
    {
     "key": "node.kubernetes.io/unreachable",
     "operator": "Exists",
     "effect": "NoExecute",
     "tolerationSeconds": 300
    }
   ],
   "priority": 0,
   "enableServiceLinks": true,
   "preemptionPolicy": "PreemptLowerPriority"
  },
  "status": {
   "phase": "Pending",
   "qosClass": "Burstable"
  }
 },
 "Nodes": null,
 "NodeNames": [
  "gpu-a100-node-1",
  "gpu-a100-node-2",
  "gpu-h100-node-3"
 ]
}
"""

FILTER_RESPONSE_JSON = """
{
 "Nodes": null,
 "NodeNames": [
  "gpu-a100-node-1"
 ],
 "FailedNodes": {
  "gpu-a100-node-2": "gpu-agent: no GPU with >= 40000 MiB free (best 23110 MiB)"
 },
 "FailedAndUnresolvableNodes": {
  "gpu-h100-node-3": "gpu-agent: node GPU health check failing"
 },
 "Error": ""
}
"""

PRIORITIZE_RESPONSE_JSON = """
[
 {
  "Host": "gpu-a100-node-1",
  "Score": 7
 }
]
"""


def filter_request() -> dict[str, Any]:
    """A fresh copy of the ExtenderArgs (callers mutate it)."""
    return json.loads(FILTER_REQUEST_JSON)


@pytest.mark.parametrize(
    ("name", "copy"),
    [
        ("extender-filter-request.json", FILTER_REQUEST_JSON),
        ("extender-filter-response.json", FILTER_RESPONSE_JSON),
        ("extender-prioritize-response.json", PRIORITIZE_RESPONSE_JSON),
    ],
)
def test_fixture_copies_match_shared(name: str, copy: str) -> None:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{path} is not here (shared/ is outside the repository)")
    assert json.loads(copy) == json.loads(path.read_text())
