"""Fetch a release of hls.js from the npm registry, check it against the checksums the
registry publishes, and vendor its player and licence under tests/data/hls.js-<version>/.

    python tests/data/update_hls_js.py 1.7.4 SHA1 SHA512-BASE64

The checksums are the registry's own (`npm view hls.js@1.7.4 dist.shasum dist.integrity`,
the integrity without its `sha512-`). The tests never fetch anything: they read the files
this writes. After an update, point `HLS_JS` in tests/live_helpers.py at the new folder,
update its README and remove the old folder.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
WANTED = {"package/dist/hls.min.js": "hls.min.js", "package/LICENSE": "LICENSE"}


def main(version: str, sha1: str, sha512: str) -> None:
    url = f"https://registry.npmjs.org/hls.js/-/hls.js-{version}.tgz"
    with urllib.request.urlopen(url, timeout=60) as reply:
        data = reply.read()
    if hashlib.sha1(data).hexdigest() != sha1:
        raise SystemExit(f"{url}: sha1 {hashlib.sha1(data).hexdigest()}, not {sha1}")
    got = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != sha512.removeprefix("sha512-"):
        raise SystemExit(f"{url}: sha512 {got}, not {sha512}")
    folder = HERE / f"hls.js-{version}"
    folder.mkdir(exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member, name in WANTED.items():
            source = archive.extractfile(member)
            if source is None:
                raise SystemExit(f"{url} has no {member}")
            (folder / name).write_bytes(source.read())
    print(f"hls.js {version} in {folder}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
