module akri-dra.test/pause

go 1.22
