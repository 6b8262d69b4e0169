//! Structural schemas of CustomResourceDefinitions: defaulting, pruning and validation.
