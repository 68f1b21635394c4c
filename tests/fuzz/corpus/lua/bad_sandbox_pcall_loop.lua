-- an endless loop whose limit error the script catches, again and again
local x = input("x", {4, 8})
local function spin() while true do end end -- ERROR
while true do pcall(spin) end
minimize(x:sum())
