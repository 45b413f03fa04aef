#!/usr/bin/env python3
"""A fake kubectl for the reconcile scenarios (scenarios/mod.rs).

It serves the two verbs a reconcile of a kind without kustomize runs:
`apply --server-side -f -` and `delete --raw=PATH -f -`, storing objects
as JSON files where the mocked API server (fake_api.rs) keeps them. Every
run is logged to calls.jsonl. A delete must carry a UID precondition. A file `apply-fails` or `delete-fails` in
the state folder makes that verb fail with the file's text on stderr;
`apply-conflicts` does so only for an apply without --force-conflicts.
"""
import json
import os
import sys
import uuid

STATE = "@STATE@"
OBJECTS = os.path.join(STATE, "objects")


def stored(path):
    return os.path.join(OBJECTS, path.strip("/").replace("/", "%") + ".json")


def fail_if(name):
    marker = os.path.join(STATE, name)
    if os.path.exists(marker):
        with open(marker) as f:
            sys.stderr.write(f.read())
        sys.exit(1)


def apply(args):
    fail_if("apply-fails")
    if "--force-conflicts" not in args:
        fail_if("apply-conflicts")
    text = sys.stdin.read()
    for doc in (d for d in text.split("---\n") if d.strip()):
        obj = json.loads(doc)
        meta = obj["metadata"]
        plural = obj["kind"].lower() + "s"
        path = f"/api/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}"
        try:
            with open(stored(path)) as f:
                meta["uid"] = json.load(f)["metadata"]["uid"]
        except FileNotFoundError:
            meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = "1"
        with open(stored(path), "w") as f:
            json.dump(obj, f)
        print(f"{obj['kind'].lower()}/{meta['name']} serverside-applied")


def delete(args):
    fail_if("delete-fails")
    path = next(a for a in args if a.startswith("--raw=")).split("=", 1)[1]
    options = json.loads(sys.stdin.read())
    name = path.rsplit("/", 1)[1]
    try:
        with open(stored(path)) as f:
            obj = json.load(f)
    except FileNotFoundError:
        sys.stderr.write(f'Error from server (NotFound): "{name}" not found\n')
        sys.exit(1)
    wanted = options.get("preconditions", {}).get("uid")
    if not wanted:
        sys.stderr.write("fake kubectl: a delete without a UID precondition\n")
        sys.exit(2)
    if wanted != obj["metadata"]["uid"]:
        sys.stderr.write(
            f"Error from server (Conflict): Precondition failed: UID in precondition: {wanted}\n"
        )
        sys.exit(1)
    os.remove(stored(path))
    print(json.dumps({"kind": "Status", "status": "Success"}))


def main():
    args = sys.argv[1:]
    with open(os.path.join(STATE, "calls.jsonl"), "a") as f:
        f.write(json.dumps(args) + "\n")
    if "apply" in args:
        apply(args)
    elif "delete" in args:
        delete(args)
    else:
        sys.stderr.write(f"fake kubectl: {args} is not served\n")
        sys.exit(2)


main()
