package migrations

// VersionTable is goose's version table inside the schema, for the tests.
const VersionTable = versionTable
