-- library calls that allocate as they go, in a loop: the wall-clock bound
-- stops the script at its line through the allocator
local x = input("x", {4, 8})
local z = string.rep("\0", 1 << 20)
while true do local q = string.format("%q", z) end -- ERROR
minimize(x:sum())
