"""A model configuration as Triton's JSON: what ``model_config`` answers and model.py reads.

Triton prints a config with every scalar present (defaults included: ``max_batch_size: 0``),
int64 fields as numbers (``dims: [4]``) and enums by name, so client code written against it
can index and compare.  protobuf's ``json_format`` leaves defaults out and writes int64 as
strings, so the dict is built from the descriptors here.  Sub-messages and oneof members
appear when set; repeated fields and maps always (empty when empty).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def config_to_dict(message: Message) -> dict[str, Any]:
    """A protobuf message as Triton's model-config JSON object."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_value(field, v) for v in value]
        elif (field.message_type is None and field.containing_oneof is None) or (
            message.HasField(field.name)  # sub-messages and oneof members only when set
        ):
            out[field.name] = _value(field, value)
    return out


def _repeated(field: FieldDescriptor) -> bool:
    if hasattr(field, "is_repeated"):  # protobuf >= 5.29 deprecates ``label``
        return bool(field.is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.message_type is not None:
        return config_to_dict(value)
    if field.enum_type is not None:
        return field.enum_type.values_by_number[value].name
    return value
