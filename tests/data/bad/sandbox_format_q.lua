-- string.format("%q") of 64 MiB of zero bytes took 31 s: the string is
-- already past the default memory bound
local x = input("x", {4, 8})
local s = string.format("%q", string.rep("\0", 2^26)) -- ERROR
minimize(x:sum())
