//! Server-side apply: field sets (fieldsV1), ownership, conflicts and managedFields bookkeeping.
