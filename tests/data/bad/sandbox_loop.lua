-- an endless loop stops at the instruction limit
local x = input("x", {4, 8})
local n = 0
while true do n = n + 1 end -- ERROR
minimize(x:sum())
