"""Run configuration: a validated settings registry loaded from YAML.

The public entry point is :func:`load_config`; :data:`SCHEMA` documents every key.
"""
from ._registry import (Setting, Config, validate_section, positive, non_negative,
                        positive_integers, file_name_problem, file_name_part, at_most, all_of,
                        expand_path)
from ._schema import (SCHEMA, RESULTS_NAME_FIELDS, load_config, parse_overrides,
                      config_from_dict, provide, yaml_load)

__all__ = ["Setting", "Config", "SCHEMA", "load_config", "parse_overrides", "config_from_dict",
           "provide", "validate_section", "positive", "non_negative", "positive_integers",
           "file_name_problem", "file_name_part", "RESULTS_NAME_FIELDS", "yaml_load", "at_most",
           "all_of", "expand_path"]
