-- a load() reader that returns 4096 chunks of 1 MiB of blanks: the parser
-- skips them without allocating, so the reader's text is bounded by the
-- memory bound
local x = input("x", {4, 8})
local n = 0
local f = load(function() n = n + 1; if n <= 4096 then return string.rep(" ", 1 << 20) end end) -- ERROR
minimize(x:sum())
