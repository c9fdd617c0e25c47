# torchrun of Debian's python3-torch 1.13, patched for Python 3.11, for comparison runs only.
# On 3.11, iterating an IntFlag skips the zero member, so Std.from_str("0") returns None and
# torchrun dies with "AttributeError: 'NoneType' object has no attribute 'get'".
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
